package eviction

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// The kubelet's local storage limits, in its order and with its messages:
// an emptyDir over its sizeLimit, then the pod over its containers'
// summed limits, then one container over its own.
func TestStorageLimitExceeded(t *testing.T) {
	limit := func(q string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse(q)}}
	}
	pod := func(volumes []corev1.Volume, init []corev1.Container, containers ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Volumes: volumes, InitContainers: init, Containers: containers}}
	}
	sized := func(name, q string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse(q))}}}
	}
	const mi = 1 << 20
	use := func(containers map[string]int64, emptyDirs map[string]int64) Storage {
		u := Storage{Containers: map[string]Use{}, EmptyDirs: map[string]Use{}}
		for n, b := range containers {
			u.Containers[n] = Use{Bytes: b}
			u.Total.Add(Use{Bytes: b})
		}
		for n, b := range emptyDirs {
			u.EmptyDirs[n] = Use{Bytes: b}
			u.Total.Add(Use{Bytes: b})
		}
		return u
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		use     Storage
		limited bool
		want    string
	}{
		{"no limits", pod(nil, nil, corev1.Container{Name: "a"}), use(map[string]int64{"a": 100 * mi}, nil), false, ""},
		{"emptyDir within", pod([]corev1.Volume{sized("scratch", "2Mi")}, nil, corev1.Container{Name: "a"}), use(nil, map[string]int64{"scratch": 2 * mi}), true, ""},
		{"emptyDir over", pod([]corev1.Volume{sized("scratch", "1Mi")}, nil, corev1.Container{Name: "a"}), use(nil, map[string]int64{"scratch": mi + 1}), true,
			`Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `},
		{"a memory emptyDir is tmpfs's to limit", pod([]corev1.Volume{{Name: "m", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi"))}}}}, nil, corev1.Container{Name: "a"}),
			use(nil, nil), false, ""},
		{"container over", pod(nil, nil, corev1.Container{Name: "a", Resources: limit("1Mi")}, corev1.Container{Name: "b", Resources: limit("4Mi")}),
			use(map[string]int64{"a": 2 * mi, "b": 0}, nil), true, `Container a exceeded its local ephemeral storage limit "1Mi". `},
		{"pod over before a container", pod([]corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}, nil,
			corev1.Container{Name: "a", Resources: limit("1Mi")}, corev1.Container{Name: "b", Resources: limit("1Mi")}),
			use(map[string]int64{"a": 2 * mi}, map[string]int64{"d": mi}), true, "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "},
		{"an init container's larger limit is the pod's", pod(nil, []corev1.Container{{Name: "i", Resources: limit("8Mi")}}, corev1.Container{Name: "a"}),
			use(map[string]int64{"a": 7 * mi}, nil), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := HasStorageLimits(tc.pod); got != tc.limited {
				t.Errorf("HasStorageLimits = %v, want %v", got, tc.limited)
			}
			if got := StorageLimitExceeded(tc.pod, tc.use); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// The node's filesystem under the kubelet's nodefs thresholds.
func TestDiskPressure(t *testing.T) {
	e := Config{}.WithDefaults()
	for _, tc := range []struct {
		name      string
		fs        Filesystem
		want      corev1.ResourceName
		threshold int64
	}{
		{"fine", Filesystem{Size: 1000, Available: 100, Inodes: 100, InodesFree: 5}, "", 0},
		{"space", Filesystem{Size: 1000, Available: 99, Inodes: 100, InodesFree: 50}, corev1.ResourceEphemeralStorage, 100},
		{"inodes", Filesystem{Size: 1000, Available: 500, Inodes: 100, InodesFree: 4}, "inodes", 5},
		{"unreadable sizes are no pressure", Filesystem{}, "", 0},
	} {
		if got, threshold, _ := e.DiskPressure(tc.fs); got != tc.want || threshold != tc.threshold {
			t.Errorf("%s: %q under %d, want %q under %d", tc.name, got, threshold, tc.want, tc.threshold)
		}
	}
}

// Disk use is counted as du counts it: blocks, and every inode; a
// directory that is gone holds nothing.
func TestDiskUse(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	u, err := DiskUse(context.Background(), dir)
	if err != nil || u.Bytes < 1<<20 || u.Inodes != 3 {
		t.Errorf("du: %+v, %v", u, err)
	}
	if u, err := DiskUse(context.Background(), filepath.Join(dir, "gone")); err != nil || u != (Use{}) {
		t.Errorf("a missing directory: %+v, %v", u, err)
	}
}

// The kubelet's eviction order: over its requests first, then lower
// priority, then further over (by gigabytes too, which an int32 would
// overflow on a 32-bit board).
func TestEvictFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b Candidate
		want int
	}{
		{"over before within", Candidate{Use: 2, Requests: 1}, Candidate{Use: 100, Requests: 200, Priority: -5}, -1},
		{"lower priority first", Candidate{Use: 5, Priority: 10}, Candidate{Use: 1, Priority: 0}, 1},
		{"further over first", Candidate{Use: 3 << 30}, Candidate{Use: 1}, -1},
		{"equal", Candidate{Use: 1}, Candidate{Use: 1}, 0},
	} {
		if got := evictFirst(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
		if first := First([]Candidate{tc.a, tc.b}); tc.want > 0 && first != 1 || tc.want <= 0 && first != 0 {
			t.Errorf("%s: First picks %d", tc.name, first)
		}
	}
	if First(nil) != -1 {
		t.Error("First of none is not -1")
	}
}

// The kubelet's messages name the container furthest over its requests.
func TestCandidatesAndMessages(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "small", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceEphemeralStorage: resource.MustParse("1Mi")}}},
		{Name: "big"},
	}}}
	mem := MemoryCandidate(pod, func(c string) int64 { return map[string]int64{"small": 32 << 20, "big": 80 << 20}[c] })
	if mem.Use != 112<<20 || mem.Requests != 64<<20 || mem.Hungriest != "big" {
		t.Errorf("memory candidate %+v", mem)
	}
	if got, want := MemoryMessage(mem, 100<<20, 50<<20), "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. Container big was using 81920Ki, request is 0, has larger consumption of memory. "; got != want {
		t.Errorf("memory message\n%q, want\n%q", got, want)
	}
	disk := DiskCandidate(Storage{Pod: pod, Containers: map[string]Use{"small": {Bytes: 3 << 20, Inodes: 9}, "big": {Bytes: 1 << 20, Inodes: 2}},
		Total: Use{Bytes: 6 << 20, Inodes: 12}}, corev1.ResourceEphemeralStorage)
	if disk.Use != 6<<20 || disk.Requests != 1<<20 || disk.Hungriest != "small" {
		t.Errorf("disk candidate %+v", disk)
	}
	inodes := DiskCandidate(Storage{Pod: pod, Containers: map[string]Use{"small": {Inodes: 9}, "big": {Inodes: 2}}, Total: Use{Inodes: 12}}, "inodes")
	if got, want := DiskMessage(inodes, "inodes", 50, 10), "The node was low on resource: inodes. Threshold quantity: 50, available: 10. Container small was using 9, request is 0, has larger consumption of inodes. "; got != want {
		t.Errorf("inodes message\n%q, want\n%q", got, want)
	}
}
