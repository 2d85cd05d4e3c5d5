package usage

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func write(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestContainer reads a container's cgroup as cadvisor does, on cgroup v2
// and v1: the working set is usage less inactive_file.
func TestContainer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Sample
		ok    bool
	}{
		{"cgroup v2", map[string]string{
			"orch/c1/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
			"orch/c1/memory.current": "10485760\n",
			"orch/c1/memory.stat":    "anon 4194304\nfile 6291456\ninactive_file 2097152\nactive_file 4194304\n",
		}, Sample{CPUNanos: 2_500_000_000, MemoryBytes: 10 << 20, WorkingSetBytes: 8 << 20, RSSBytes: 4 << 20}, true},
		{"cgroup v2 without the memory controller", map[string]string{
			"orch/c1/cpu.stat": "usage_usec 7\n",
		}, Sample{CPUNanos: 7000}, true},
		{"cgroup v1", map[string]string{
			"cpu,cpuacct/orch/c1/cpuacct.usage":       "123456789\n",
			"memory/orch/c1/memory.usage_in_bytes":    "3000\n",
			"memory/orch/c1/memory.stat":              "total_rss 1000\ntotal_inactive_file 5000\n",
			"memory/orch/other/memory.usage_in_bytes": "1\n",
		}, Sample{CPUNanos: 123456789, MemoryBytes: 3000, WorkingSetBytes: 0, RSSBytes: 1000}, true},
		{"gone", map[string]string{"orch/other/cpu.stat": "usage_usec 1\n"}, Sample{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := Root
			Root = write(t, tc.files)
			defer func() { Root = old }()
			got, ok := Container("c1")
			got.Time = time.Time{}
			if ok != tc.ok || got != tc.want {
				t.Errorf("Container = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestNode reads /proc/stat (idle and iowait left out) and /proc/meminfo.
func TestNode(t *testing.T) {
	old := procRoot
	defer func() { procRoot = old }()
	procRoot = write(t, map[string]string{
		"stat":    "cpu  100 20 30 4000 50 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n",
		"meminfo": "MemTotal:        1000 kB\nMemFree:          300 kB\nMemAvailable:     600 kB\nInactive(file):   200 kB\nAnonPages:        100 kB\n",
	})
	got, err := Node()
	if err != nil {
		t.Fatal(err)
	}
	// user+nice+system+irq+softirq+steal = 171 ticks of 10 ms.
	if got.CPUNanos != 171*10_000_000 || got.MemoryBytes != 700<<10 || got.WorkingSetBytes != 500<<10 || got.RSSBytes != 100<<10 {
		t.Errorf("Node = %+v", got)
	}
	procRoot = write(t, map[string]string{"stat": "intr 1 2 3\n", "meminfo": ""})
	if _, err := Node(); err == nil {
		t.Error("a /proc/stat without its cpu line: no error")
	}
	// The real one, on this machine.
	procRoot = old
	if s, err := Node(); err != nil || s.CPUNanos == 0 || s.WorkingSetBytes == 0 {
		t.Errorf("this machine: %+v, %v", s, err)
	}
}

func TestRate(t *testing.T) {
	at := time.Unix(1000, 0)
	for _, tc := range []struct {
		name      string
		prev, cur Sample
		nanocores uint64
	}{
		{"half a core", Sample{Time: at, CPUNanos: 1e9}, Sample{Time: at.Add(2 * time.Second), CPUNanos: 2e9}, 5e8},
		{"a restart", Sample{Time: at, CPUNanos: 5e9}, Sample{Time: at.Add(time.Second), CPUNanos: 1e9}, 0},
		{"out of order", Sample{Time: at.Add(time.Second), CPUNanos: 1}, Sample{Time: at, CPUNanos: 2}, 0},
	} {
		if got := Rate(tc.prev, tc.cur); got != tc.nanocores {
			t.Errorf("%s: Rate = %d, want %d", tc.name, got, tc.nanocores)
		}
	}
}
