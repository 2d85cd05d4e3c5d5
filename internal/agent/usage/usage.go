// Package usage reads what the node and each container use of CPU and
// memory, from /proc and the containers' cgroups (v2 or v1), as cadvisor
// measures them for the kubelet: CPU as cumulative core-nanoseconds,
// memory as the working set (usage less the page cache the kernel can
// drop), the figure eviction and `kubectl top` go by.
package usage

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Sample is one reading of a container's or the node's use.
type Sample struct {
	// Time is when it was read.
	Time time.Time
	// CPUNanos is the CPU time used since start, in core-nanoseconds.
	CPUNanos uint64
	// MemoryBytes is all memory charged, page cache included.
	MemoryBytes uint64
	// WorkingSetBytes is MemoryBytes less the inactive file cache.
	WorkingSetBytes uint64
	// RSSBytes is anonymous memory (heap and stacks).
	RSSBytes uint64
}

// Root is where cgroup file systems are mounted; tests point it elsewhere.
var Root = "/sys/fs/cgroup"

// procRoot is where /proc is; tests point it elsewhere.
var procRoot = "/proc"

// Container reads the container's cgroup, which containerd puts at
// /orch/<id> (orch's containerd namespace). ok is false when the cgroup
// is gone (a container not running).
func Container(id string) (s Sample, ok bool) {
	s.Time = time.Now()
	v2 := filepath.Join(Root, "orch", id)
	if stat, err := readKeyed(filepath.Join(v2, "cpu.stat")); err == nil {
		s.CPUNanos = stat["usage_usec"] * 1000
		mem, err := readUint(filepath.Join(v2, "memory.current"))
		if err != nil {
			return s, true // no memory controller delegated: CPU alone
		}
		memStat, _ := readKeyed(filepath.Join(v2, "memory.stat"))
		s.MemoryBytes, s.RSSBytes = mem, memStat["anon"]
		s.WorkingSetBytes = sub(mem, memStat["inactive_file"])
		return s, true
	}
	cpu, err := readUint(filepath.Join(Root, "cpuacct", "orch", id, "cpuacct.usage"))
	if err != nil {
		cpu, err = readUint(filepath.Join(Root, "cpu,cpuacct", "orch", id, "cpuacct.usage"))
	}
	mem, memErr := readUint(filepath.Join(Root, "memory", "orch", id, "memory.usage_in_bytes"))
	if err != nil && memErr != nil {
		return s, false
	}
	s.CPUNanos, s.MemoryBytes = cpu, mem
	memStat, _ := readKeyed(filepath.Join(Root, "memory", "orch", id, "memory.stat"))
	s.RSSBytes = memStat["total_rss"]
	s.WorkingSetBytes = sub(mem, memStat["total_inactive_file"])
	return s, true
}

// userHZ is the unit of /proc/stat's times: USER_HZ, 100 on every Linux
// architecture orch runs on.
const userHZ = 100

// Node reads the whole machine's use: CPU from /proc/stat (every state but
// idle and iowait, as cadvisor counts the root cgroup) and memory from
// /proc/meminfo (total less free, and less the inactive file cache for
// the working set).
func Node() (Sample, error) {
	s := Sample{Time: time.Now()}
	data, err := os.ReadFile(filepath.Join(procRoot, "stat"))
	if err != nil {
		return s, fmt.Errorf("node CPU: %w", err)
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) < 8 || fields[0] != "cpu" {
		return s, fmt.Errorf("node CPU: unexpected /proc/stat line %q", line)
	}
	var ticks uint64
	// user nice system idle iowait irq softirq steal ...
	for i, f := range fields[1:min(len(fields), 9)] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return s, fmt.Errorf("node CPU: %w", err)
		}
		ticks += n
	}
	s.CPUNanos = ticks * (uint64(time.Second) / userHZ)
	info, err := readKeyed(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return s, fmt.Errorf("node memory: %w", err)
	}
	// /proc/meminfo counts in kB.
	s.MemoryBytes = sub(info["MemTotal:"], info["MemFree:"]) << 10
	s.WorkingSetBytes = sub(s.MemoryBytes, info["Inactive(file):"]<<10)
	s.RSSBytes = info["AnonPages:"] << 10
	return s, nil
}

// Rate is the CPU used between two samples, in nanocores (a billionth of a
// core); zero when they are not in order or the counter went back (a
// container restarted).
func Rate(prev, cur Sample) uint64 {
	dt := cur.Time.Sub(prev.Time)
	if dt <= 0 || cur.CPUNanos < prev.CPUNanos {
		return 0
	}
	return uint64(float64(cur.CPUNanos-prev.CPUNanos) / dt.Seconds())
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

func readUint(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKeyed reads a file of "key value" lines (cpu.stat, memory.stat,
// /proc/meminfo); values that do not parse are left out.
func readKeyed(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		if n, err := strconv.ParseUint(fields[1], 10, 64); err == nil {
			out[fields[0]] = n
		}
	}
	return out, sc.Err()
}
