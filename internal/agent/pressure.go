package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/orch-dev/orch/internal/agent/eviction"
	corev1 "k8s.io/api/core/v1"
)

// The kubelet's default hard eviction thresholds, under which the node
// reports pressure (and the scheduler sends it nothing more).
const (
	memoryAvailableMin = 100 << 20 // memory.available<100Mi
	diskAvailableMin   = 0.10      // nodefs.available<10%
	inodesFreeMin      = 0.05      // nodefs.inodesFree<5%
	pidsAvailableMin   = 0.05      // orch's own: 5% of pid_max left
)

// evictionConfig fills in what the node's pod eviction reads memory and the
// data dir's filesystem with, and its thresholds: the same as the
// pressure conditions'.
func evictionConfig(e eviction.Config, dataDir string) eviction.Config {
	if e.MemoryAvailable == nil {
		e.MemoryAvailable = memAvailable
	}
	if e.MemoryAvailableMin == 0 {
		e.MemoryAvailableMin = memoryAvailableMin
	}
	if e.NodeFS == nil {
		e.NodeFS = func() (eviction.Filesystem, error) { return statFilesystem(dataDir) }
	}
	if e.NodeFSAvailableMin == 0 {
		e.NodeFSAvailableMin = diskAvailableMin
	}
	if e.NodeFSInodesFreeMin == 0 {
		e.NodeFSInodesFreeMin = inodesFreeMin
	}
	return e
}

// statFilesystem reads the filesystem holding dir; available is what
// unprivileged users may still write, as the kubelet counts it.
func statFilesystem(dir string) (eviction.Filesystem, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return eviction.Filesystem{}, fmt.Errorf("filesystem of %s: %w", dir, err)
	}
	return eviction.Filesystem{Size: int64(st.Blocks) * int64(st.Bsize), Available: int64(st.Bavail) * int64(st.Bsize),
		Inodes: int64(st.Files), InodesFree: int64(st.Ffree)}, nil
}

// readings are what pressure is judged from.
type readings struct {
	memAvailable             int64
	disk                     eviction.Filesystem
	pidsInUse, pidsMax       int64
	diskErr, memErr, pidsErr error
}

// readNode reads memory, the data dir's filesystem and process counts.
func readNode(dataDir string) readings {
	var r readings
	r.memAvailable, r.memErr = memAvailable()
	r.disk, r.diskErr = statFilesystem(dataDir)
	r.pidsInUse, r.pidsMax, r.pidsErr = pids()
	return r
}

// pressureConditions are the node's MemoryPressure, DiskPressure and
// PIDPressure as the kubelet words them.
func pressureConditions(r readings) []corev1.NodeCondition {
	cond := func(t corev1.NodeConditionType, under bool, yes, no [2]string) corev1.NodeCondition {
		if under {
			return corev1.NodeCondition{Type: t, Status: corev1.ConditionTrue, Reason: yes[0], Message: yes[1]}
		}
		return corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Reason: no[0], Message: no[1]}
	}
	memory := r.memErr == nil && r.memAvailable < memoryAvailableMin
	short, _, _ := evictionConfig(eviction.Config{}, "").DiskPressure(r.disk)
	disk := r.diskErr == nil && short != ""
	pid := r.pidsErr == nil && r.pidsMax > 0 && float64(r.pidsMax-r.pidsInUse)/float64(r.pidsMax) < pidsAvailableMin
	return []corev1.NodeCondition{
		cond(corev1.NodeMemoryPressure, memory, [2]string{"KubeletHasInsufficientMemory", "kubelet has insufficient memory available"},
			[2]string{"KubeletHasSufficientMemory", "kubelet has sufficient memory available"}),
		cond(corev1.NodeDiskPressure, disk, [2]string{"KubeletHasDiskPressure", "kubelet has disk pressure"},
			[2]string{"KubeletHasNoDiskPressure", "kubelet has no disk pressure"}),
		cond(corev1.NodePIDPressure, pid, [2]string{"KubeletHasInsufficientPID", "kubelet has insufficient PID available"},
			[2]string{"KubeletHasSufficientPID", "kubelet has sufficient PID available"}),
	}
}

func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// pids is the number of threads running and the kernel's limit.
func pids() (inUse, limit int64, err error) {
	data, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return 0, 0, err
	}
	if limit, err = strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err != nil {
		return 0, 0, err
	}
	// The fourth field of loadavg is running/total scheduling entities.
	data, err = os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, 0, err
	}
	fields := strings.Fields(string(data))
	if len(fields) < 4 {
		return 0, 0, fmt.Errorf("unexpected /proc/loadavg %q", data)
	}
	_, total, ok := strings.Cut(fields[3], "/")
	if !ok {
		return 0, 0, fmt.Errorf("unexpected /proc/loadavg %q", data)
	}
	inUse, err = strconv.ParseInt(total, 10, 64)
	return inUse, limit, err
}
