// Package proctest reads what a process uses from /proc, for benchmarks:
// its CPU time, resident memory and the bytes it has had written to
// storage.
package proctest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// TicksPerSecond is USER_HZ, the unit of CPUTicks.
const TicksPerSecond = 100

// CPUTicks is a process's user and system time, in clock ticks; 0 when
// the process is gone.
func CPUTicks(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime
}

// RSSMB is a process's resident memory in MiB.
func RSSMB(pid int) float64 {
	kb, _ := field(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
	return float64(kb) / 1024
}

// FileRSSMB is the part of a process's resident memory that maps files
// (bbolt's database, the binary): pages the kernel can drop and read
// again, unlike the rest.
func FileRSSMB(pid int) float64 {
	kb, _ := field(fmt.Sprintf("/proc/%d/status", pid), "RssFile:")
	return float64(kb) / 1024
}

// WrittenBytes is what a process has caused to be written to storage
// (write_bytes of /proc/PID/io: page cache it dirtied and flushed, its
// direct and synced writes), as a disk of its own would count them.
func WrittenBytes(pid int) int64 {
	n, _ := field(fmt.Sprintf("/proc/%d/io", pid), "write_bytes:")
	return n
}

// field is the number after prefix on a line of path (a unit after it
// ignored).
func field(path, prefix string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, prefix)
}
