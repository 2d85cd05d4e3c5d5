// Package memtrim gives back, once a process has started, the memory only
// its start needed. A Go program has no discardable init section: package
// initialisation, the first informer lists and the first pod syncs touch
// code and read-only data all over the executable (and the kernel maps 64
// KiB around each page it faults in), and those pages stay resident for the
// life of the process. On a 512 MB board that is more than half the agent's
// resident memory; paging them out once lets the steady state fault back in
// only what it uses.
package memtrim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// AfterStartup waits for delay, then calls Release and logs what it did.
// It returns early, doing nothing, when ctx ends.
func AfterStartup(ctx context.Context, delay time.Duration, log *slog.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(delay):
	}
	advised, err := Release()
	switch {
	case errors.Is(err, unix.EINVAL):
		// Kernels before 5.4 have no MADV_PAGEOUT: the pages stay until
		// memory pressure reclaims them, as before.
		log.Debug("startup pages not released: the kernel cannot page out on request", "err", err)
	case err != nil:
		log.Warn("releasing startup memory", "err", err)
	default:
		log.Debug("startup memory released", "executableMB", advised>>20)
	}
}

// Release returns the heap's free memory to the system and asks the kernel
// to page out the executable's code and read-only data, which it reads
// back as they are used. It returns how many bytes of mappings it advised.
// Pages another process also maps stay where they are.
func Release() (int, error) {
	// Two collections: sync.Pool buffers survive the first.
	runtime.GC()
	debug.FreeOSMemory()
	mappings, err := executableMappings()
	if err != nil {
		return 0, err
	}
	advised := 0
	for _, m := range mappings {
		// The address range is the process's own mapping, read from
		// /proc/self/maps; MADV_PAGEOUT only drops clean pages from it.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_PAGEOUT); errno != 0 {
			return advised, fmt.Errorf("madvise(MADV_PAGEOUT) %#x-%#x: %w", m.start, m.end, errno)
		}
		advised += int(m.end - m.start)
	}
	return advised, nil
}

type mapping struct{ start, end uintptr }

// executableMappings are the read-only mappings of the running program's
// file: its code and read-only data, not its writable data.
func executableMappings() ([]mapping, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("find the executable: %w", err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode pathname (which may hold spaces,
		// as " (deleted)" does after an upgrade replaced the file).
		fields := strings.SplitN(sc.Text(), " ", 6)
		if len(fields) < 6 || strings.TrimLeft(fields[5], " ") != exe || strings.Contains(fields[1], "w") {
			continue
		}
		start, end, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		lo, err1 := strconv.ParseUint(start, 16, 64)
		hi, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("parse /proc/self/maps line %q", sc.Text())
		}
		out = append(out, mapping{uintptr(lo), uintptr(hi)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/maps: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no mapping of %s in /proc/self/maps", exe)
	}
	return out, nil
}
