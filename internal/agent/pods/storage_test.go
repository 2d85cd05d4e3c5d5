package pods

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
	use := func(containers map[string]int64, emptyDirs map[string]int64) podStorage {
		u := podStorage{containers: map[string]storageUse{}, emptyDirs: map[string]storageUse{}}
		for n, b := range containers {
			u.containers[n] = storageUse{bytes: b}
			u.total.add(storageUse{bytes: b})
		}
		for n, b := range emptyDirs {
			u.emptyDirs[n] = storageUse{bytes: b}
			u.total.add(storageUse{bytes: b})
		}
		return u
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		use     podStorage
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
			if got := hasStorageLimits(tc.pod); got != tc.limited {
				t.Errorf("hasStorageLimits = %v, want %v", got, tc.limited)
			}
			if got := storageLimitExceeded(tc.pod, tc.use); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// The node's filesystem under the kubelet's nodefs thresholds.
func TestDiskPressure(t *testing.T) {
	e := Eviction{}.withDefaults()
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
	u, err := diskUse(context.Background(), dir)
	if err != nil || u.bytes < 1<<20 || u.inodes != 3 {
		t.Errorf("du: %+v, %v", u, err)
	}
	if u, err := diskUse(context.Background(), filepath.Join(dir, "gone")); err != nil || u != (storageUse{}) {
		t.Errorf("a missing directory: %+v, %v", u, err)
	}
}

// The kubelet's eviction order: over its requests first, then lower
// priority, then further over (by gigabytes too, which an int32 would
// overflow on a 32-bit board).
func TestEvictFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b rank
		want int
	}{
		{"over before within", rank{use: 2, requests: 1}, rank{use: 100, requests: 200, priority: -5}, -1},
		{"lower priority first", rank{use: 5, priority: 10}, rank{use: 1, priority: 0}, 1},
		{"further over first", rank{use: 3 << 30}, rank{use: 1}, -1},
		{"equal", rank{use: 1}, rank{use: 1}, 0},
	} {
		if got := evictFirst(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
