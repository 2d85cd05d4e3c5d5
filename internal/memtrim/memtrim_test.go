package memtrim

import (
	"bufio"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReleasePagesOutTheExecutable(t *testing.T) {
	before := executableResidentKB(t)
	advised, err := Release()
	if errors.Is(err, unix.EINVAL) {
		t.Skip("this kernel has no MADV_PAGEOUT (Linux 5.4)")
	}
	if err != nil {
		t.Fatal(err)
	}
	after := executableResidentKB(t)
	t.Logf("executable resident: %d kB before, %d kB after paging out %d kB of mappings", before, after, advised>>10)
	if advised == 0 || after*2 > before {
		t.Errorf("executable resident %d kB after Release, was %d kB: want it at least halved", after, before)
	}
}

func TestExecutableMappingsAreReadOnly(t *testing.T) {
	maps, err := executableMappings()
	if err != nil {
		t.Fatal(err)
	}
	// A Go executable maps its code and its read-only data (and, writable,
	// its data, which is left alone).
	if len(maps) < 2 {
		t.Fatalf("got %d read-only mappings of the executable, want code and rodata", len(maps))
	}
	for _, m := range maps {
		if m.end <= m.start {
			t.Errorf("mapping %#x-%#x is empty", m.start, m.end)
		}
	}
}

// executableResidentKB sums Rss over the executable's read-only mappings.
func executableResidentKB(t *testing.T) int {
	t.Helper()
	maps, err := executableMappings()
	if err != nil {
		t.Fatal(err)
	}
	starts := map[string]bool{}
	for _, m := range maps {
		starts[strconv.FormatUint(uint64(m.start), 16)] = true
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) > 0 && !strings.HasSuffix(fields[0], ":") { // a mapping's first line
			start, _, _ := strings.Cut(fields[0], "-")
			in = starts[strings.TrimLeft(start, "0")]
			continue
		}
		if v, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			total += kb
		}
	}
	return total
}
