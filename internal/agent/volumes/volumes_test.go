package volumes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	corev1 "k8s.io/api/core/v1"
)

// The atomic writer: files behind ..data, unchanged content not
// rewritten, removed keys gone, paths out of the volume refused.
func TestWriteProjection(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	files := map[string]projectedFile{"a": {data: []byte("1"), mode: 0o644}, "sub/b": {data: []byte("2"), mode: 0o600}}
	if err := writeProjection(dir, files, false, nil); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { data, _ := os.ReadFile(filepath.Join(dir, p)); return string(data) }
	if read("a") != "1" || read("sub/b") != "2" {
		t.Fatalf("got a=%q sub/b=%q", read("a"), read("sub/b"))
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub/b")); fi.Mode().Perm() != 0o600 {
		t.Errorf("sub/b mode %v", fi.Mode())
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := writeProjection(dir, files, false, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, "..data")); again != first {
		t.Errorf("unchanged content rewritten: %s then %s", first, again)
	}
	time.Sleep(time.Millisecond)
	if err := writeProjection(dir, map[string]projectedFile{"a": {data: []byte("new"), mode: 0o644}}, false, nil); err != nil {
		t.Fatal(err)
	}
	if read("a") != "new" {
		t.Errorf("a = %q after the update", read("a"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "sub")); !os.IsNotExist(err) {
		t.Errorf("sub still there after its key went: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 3 || !slices.Contains(names, "..data") || !slices.Contains(names, "a") {
		t.Errorf("volume holds %v, want a, ..data and one data directory", names)
	}
	for _, bad := range []string{"../escape", "/abs", "..data"} {
		if err := writeProjection(dir, map[string]projectedFile{bad: {data: []byte("x")}}, false, nil); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
}

func TestSubPath(t *testing.T) {
	vol := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(vol, "out")); err != nil {
		t.Fatal(err)
	}
	if p, err := subPath(vol, "new/dir"); err != nil || !strings.HasSuffix(p, "new/dir") {
		t.Errorf("subPath new/dir: %q %v", p, err)
	}
	for _, bad := range []string{"../x", "/etc", "out", "a/../../x"} {
		if _, err := subPath(vol, bad); err == nil {
			t.Errorf("subPath %q accepted", bad)
		}
	}
}

func TestCheckHostPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		typ  corev1.HostPathType
		ok   bool
	}{
		{dir, corev1.HostPathDirectory, true},
		{file, corev1.HostPathDirectory, false},
		{file, corev1.HostPathFile, true},
		{filepath.Join(dir, "missing"), corev1.HostPathFile, false},
		{filepath.Join(dir, "made/here"), corev1.HostPathDirectoryOrCreate, true},
		{filepath.Join(dir, "made/file"), corev1.HostPathFileOrCreate, true},
		{file, corev1.HostPathSocket, false},
		{filepath.Join(dir, "anything"), corev1.HostPathUnset, true},
	} {
		err := checkHostPath(&corev1.HostPathVolumeSource{Path: tc.path, Type: &tc.typ})
		if (err == nil) != tc.ok {
			t.Errorf("%s as %q: %v", tc.path, tc.typ, err)
		}
	}
}

type fakeSources map[string]*corev1.ConfigMap

func (f fakeSources) ConfigMap(_ context.Context, name string) (*corev1.ConfigMap, error) {
	return f[name], nil
}
func (f fakeSources) Secret(context.Context, string) (*corev1.Secret, error) { return nil, nil }

func (f fakeSources) ServiceAccountToken(_ context.Context, pod *corev1.Pod, _ *corev1.ServiceAccountTokenProjection) (string, error) {
	return "token-of-" + pod.Spec.ServiceAccountName, nil
}

type fakeFields struct{}

func (fakeFields) PodField(pod *corev1.Pod, path string) (string, error) {
	if path == "metadata.name" {
		return pod.Name, nil
	}
	return "", &Error{Reason: "CreateContainerConfigError", Message: "unsupported fieldRef " + path}
}
func (fakeFields) ResourceField(*corev1.Pod, *corev1.Container, *corev1.ResourceFieldSelector) (string, error) {
	return "", nil
}

// TestSetUp: what each volume becomes on the node, and the waiting reason
// for the ones the pod cannot have yet, as the kubelet reports them.
func TestSetUp(t *testing.T) {
	src := fakeSources{"settings": {Data: map[string]string{"a.conf": "x=1", "b.conf": "y=2"}}}
	for _, tc := range []struct {
		name   string
		volume corev1.VolumeSource
		files  map[string]string // what the volume holds, nil when it fails
		reason string
	}{
		{name: "configmap", volume: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
			files: map[string]string{"a.conf": "x=1", "b.conf": "y=2"}},
		{name: "configmap items", volume: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"},
			Items: []corev1.KeyToPath{{Key: "b.conf", Path: "conf/b"}}}},
			files: map[string]string{"conf/b": "y=2"}},
		{name: "missing configmap", volume: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}},
			reason: "ContainerCreating"},
		{name: "optional missing configmap", volume: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}},
			files: map[string]string{}},
		{name: "missing key", volume: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"},
			Items: []corev1.KeyToPath{{Key: "c.conf", Path: "c"}}}},
			reason: "ContainerCreating"},
		{name: "downward", volume: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}},
			files: map[string]string{"name": "p"}},
		{name: "downward bad field", volume: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{Path: "x", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nope"}}}}},
			reason: "CreateContainerConfigError"},
		{name: "unsupported", volume: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nas", Path: "/"}},
			reason: "ContainerCreating"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}, Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "v", VolumeSource: tc.volume}}}}
			paths, err := SetUp(context.Background(), root, src, fakeFields{}, pod)
			if tc.files == nil {
				var ve *Error
				if !errors.As(err, &ve) || ve.Reason != tc.reason {
					t.Fatalf("error %v, want a volumes.Error with reason %s", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p := paths["v"]; p.Path != filepath.Join(root, "v") || !p.API {
				t.Errorf("path %+v, want %s, read-only as the API's", p, filepath.Join(root, "v"))
			}
			for name, want := range tc.files {
				if got, err := os.ReadFile(filepath.Join(root, "v", name)); err != nil || string(got) != want {
					t.Errorf("%s: %q, %v, want %q", name, got, err, want)
				}
			}
			mounts, err := Mounts(&corev1.Container{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/etc/app"}}}, paths)
			if err != nil || len(mounts) != 1 || !slices.Contains(mounts[0].Options, "ro") {
				t.Errorf("mounts %+v, %v: want one read-only bind mount", mounts, err)
			}
		})
	}
	if _, err := Mounts(&corev1.Container{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "nope", MountPath: "/x"}}}, Paths{}); err == nil {
		t.Error("a mount of no volume of the pod accepted")
	}
}

// flakySources gives tokens while up, and fails as an unreachable server
// does otherwise.
type flakySources struct {
	fakeSources
	up    bool
	calls int
}

func (f *flakySources) ServiceAccountToken(_ context.Context, _ *corev1.Pod, _ *corev1.ServiceAccountTokenProjection) (string, error) {
	f.calls++
	if !f.up {
		return "", errors.New("dial tcp 10.0.0.1:6443: connect: no route to host")
	}
	return fmt.Sprintf("token-%d", f.calls), nil
}

// TestProjectedTokenKeptOffline: a projected token is written with the
// rest of its volume and refreshed when its source gives a new one; while
// the API cannot be asked, the volume keeps the last token, as the
// kubelet keeps a volume it cannot refresh; a volume never set up fails.
func TestProjectedTokenKeptOffline(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("projected volumes are tmpfs: needs root")
	}
	root := t.TempDir()
	defer func() { _ = TearDown(root) }()
	src := &flakySources{fakeSources: fakeSources{"kube-root-ca.crt": {Data: map[string]string{"ca.crt": "CA"}}}, up: true}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}, Spec: corev1.PodSpec{ServiceAccountName: "robot",
		Volumes: []corev1.Volume{{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
		}}}}}}}
	token := func() string {
		b, err := os.ReadFile(filepath.Join(root, "kube-api-access-x", "token"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i, want := range []string{"token-1", "token-2"} {
		if _, err := SetUp(context.Background(), root, src, fakeFields{}, pod); err != nil {
			t.Fatalf("set up %d: %v", i, err)
		}
		if got := token(); got != want {
			t.Fatalf("token %q, want %q", got, want)
		}
	}
	src.up = false
	if _, err := SetUp(context.Background(), root, src, fakeFields{}, pod); err != nil {
		t.Fatalf("refresh with the server away: %v", err)
	}
	if got := token(); got != "token-2" {
		t.Errorf("token while the server is away: %q, want the last one", got)
	}
	if _, err := SetUp(context.Background(), t.TempDir(), src, fakeFields{}, pod); err == nil {
		t.Error("a volume never set up was made without its token")
	}
}
