package volumes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/roottest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
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

// The claims of the tests: "data" bound to a hostPath volume, "pending"
// not bound.
func (f fakeSources) PersistentVolumeClaim(_ context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	switch name {
	case "data":
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "data-uid"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-data"},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}, nil
	case "pending":
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}, nil
	}
	return nil, nil
}

func (f fakeSources) PersistentVolume(_ context.Context, name string) (*corev1.PersistentVolume, error) {
	if name != "pv-data" {
		return nil, nil
	}
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		ClaimRef: &corev1.ObjectReference{Name: "data", UID: "data-uid"},
		PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: filepath.Join(os.TempDir(), "orch-volumes-test-pv-data"), Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}}, nil
}

func (f fakeSources) KeepLocalVolume(*corev1.PersistentVolume) error { return nil }

func (f fakeSources) ImageVolume(context.Context, *corev1.Pod, string, *corev1.ImageVolumeSource, string) error {
	return errors.New("no images here")
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
	roottest.Require(t, "projected volumes on tmpfs")
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

// claimSources are fakeSources whose claims the API may not answer for.
type claimSources struct {
	fakeSources
	down bool
}

func (c claimSources) PersistentVolumeClaim(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	if c.down {
		return nil, errors.New("dial tcp 10.0.0.1:6443: connect: no route to host")
	}
	return c.fakeSources.PersistentVolumeClaim(ctx, name)
}

// TestClaims: a bound claim is its volume's path on the node (a
// DirectoryOrCreate hostPath made), mounted read-only when the pod says
// so; an unbound or missing claim waits with the kubelet's words; with
// the API away, a claim set up before is still its volume.
func TestClaims(t *testing.T) {
	data := filepath.Join(os.TempDir(), "orch-volumes-test-pv-data")
	t.Cleanup(func() { _ = os.RemoveAll(data) })
	claim := func(name string, ro bool) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u"}, Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "v",
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name, ReadOnly: ro}}}}}}
	}
	root := t.TempDir()
	paths, err := SetUp(context.Background(), root, claimSources{}, fakeFields{}, claim("data", true))
	if err != nil {
		t.Fatal(err)
	}
	if p := paths["v"]; p.Path != data || !p.ReadOnly {
		t.Errorf("claim's path %+v, want %s read-only", p, data)
	}
	if st, err := os.Stat(data); err != nil || !st.IsDir() {
		t.Errorf("the DirectoryOrCreate volume was not made: %v", err)
	}
	mounts, err := Mounts(&corev1.Container{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}, paths)
	if err != nil || len(mounts) != 1 || mounts[0].Source != data || !slices.Contains(mounts[0].Options, "ro") {
		t.Errorf("mounts %+v, %v", mounts, err)
	}
	paths, err = SetUp(context.Background(), root, claimSources{down: true}, fakeFields{}, claim("data", false))
	if err != nil || paths["v"].Path != data {
		t.Errorf("with the API away: %+v, %v", paths, err)
	}
	if err := TearDown(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(data); err != nil {
		t.Errorf("the pod's teardown touched the volume's data: %v", err)
	}
	for name, want := range map[string]string{
		"pending": "error processing PVC default/pending: PVC is not bound",
		"absent":  `error processing PVC default/absent: persistentvolumeclaim "absent" not found`,
	} {
		_, err := SetUp(context.Background(), t.TempDir(), claimSources{}, fakeFields{}, claim(name, false))
		var ve *Error
		if !errors.As(err, &ve) || ve.Reason != "ContainerCreating" || !strings.Contains(ve.Message, want) {
			t.Errorf("claim %s: %v, want ContainerCreating: %s", name, err, want)
		}
	}
	if _, err := SetUp(context.Background(), t.TempDir(), claimSources{down: true}, fakeFields{}, claim("data", false)); err == nil {
		t.Error("a claim never set up, with the API away, gave a volume")
	}
}

// trustBundles are the ClusterTrustBundles the fake sources know.
var trustBundles []certificatesv1.ClusterTrustBundle

func (f fakeSources) ClusterTrustBundle(_ context.Context, name string) (*certificatesv1.ClusterTrustBundle, error) {
	for i := range trustBundles {
		if trustBundles[i].Name == name {
			return &trustBundles[i], nil
		}
	}
	return nil, nil
}

func (f fakeSources) ClusterTrustBundles(_ context.Context, signer string, sel labels.Selector) ([]certificatesv1.ClusterTrustBundle, error) {
	var out []certificatesv1.ClusterTrustBundle
	for _, b := range trustBundles {
		if b.Spec.SignerName == signer && sel.Matches(labels.Set(b.Labels)) {
			out = append(out, b)
		}
	}
	return out, nil
}

// caPEM is a self-signed CA certificate named cn.
func caPEM(t *testing.T, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestClusterTrustBundleProjection: the kubelet's clusterTrustBundle
// source — by name, or a signer's bundles a selector picks (nil: none,
// empty: all), every certificate once; missing is an error unless
// optional, then an empty file.
func TestClusterTrustBundleProjection(t *testing.T) {
	a, b, c := caPEM(t, "a"), caPEM(t, "b"), caPEM(t, "c")
	trustBundles = []certificatesv1.ClusterTrustBundle{
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: a + b}},
		{ObjectMeta: metav1.ObjectMeta{Name: "example.com:signer:one", Labels: map[string]string{"tier": "x"}}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/signer", TrustBundle: b + c}},
		{ObjectMeta: metav1.ObjectMeta{Name: "example.com:signer:two"}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/signer", TrustBundle: a}},
	}
	t.Cleanup(func() { trustBundles = nil })
	p := projector{src: fakeSources{}}
	count := func(data []byte) int { return strings.Count(string(data), "BEGIN CERTIFICATE") }
	for _, tc := range []struct {
		name  string
		src   corev1.ClusterTrustBundleProjection
		certs int
		err   string
	}{
		{"by name", corev1.ClusterTrustBundleProjection{Name: ptr.To("plain")}, 2, ""},
		{"missing", corev1.ClusterTrustBundleProjection{Name: ptr.To("nope")}, 0, `clustertrustbundle "nope" not found`},
		{"missing, optional", corev1.ClusterTrustBundleProjection{Name: ptr.To("nope"), Optional: ptr.To(true)}, 0, ""},
		{"a signer's, all", corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/signer"), LabelSelector: &metav1.LabelSelector{}}, 3, ""},
		{"a signer's, selected", corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/signer"), LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "x"}}}, 2, ""},
		{"a signer's, nil selector", corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/signer")}, 0, "matched zero ClusterTrustBundles"},
	} {
		tc.src.Path = "ca.pem"
		files, err := p.trustBundleFiles(context.Background(), &tc.src, 0o644)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case count(files["ca.pem"].data) != tc.certs:
			t.Errorf("%s: %d certificates, want %d", tc.name, count(files["ca.pem"].data), tc.certs)
		}
	}
}

// PodCertificate of the fake sources: issued for the signer
// example.com/ok, waiting for any other.
func (f fakeSources) PodCertificate(_ context.Context, pod *corev1.Pod, volume string, index int, p *corev1.PodCertificateProjection) ([]byte, []byte, error) {
	if p.SignerName != "example.com/ok" {
		return nil, nil, &Error{Reason: "ContainerCreating", Message: "waiting for PodCertificateRequest"}
	}
	return []byte("KEY\n"), []byte(fmt.Sprintf("CHAIN of %s/%s #%d\n", pod.Name, volume, index)), nil
}

// TestPodCertificateProjection: the kubelet's files of a podCertificate
// source — the credential bundle (key then chain), the key, the chain —
// and the pod waiting while its request is not issued.
func TestPodCertificateProjection(t *testing.T) {
	p := projector{src: fakeSources{}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	files, err := p.projectedFiles(context.Background(), pod, "certs", &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ConfigMap: nil, PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/ok", KeyType: "ED25519",
			CredentialBundlePath: "bundle.pem", KeyPath: "key.pem", CertificateChainPath: "chain.pem"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(files["bundle.pem"].data); got != "KEY\nCHAIN of web/certs #0\n" {
		t.Errorf("bundle %q", got)
	}
	if string(files["key.pem"].data) != "KEY\n" || string(files["chain.pem"].data) != "CHAIN of web/certs #0\n" {
		t.Errorf("key %q, chain %q", files["key.pem"].data, files["chain.pem"].data)
	}
	_, err = p.projectedFiles(context.Background(), pod, "certs", &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/slow", KeyType: "ED25519", KeyPath: "key.pem"}}}})
	var ve *Error
	if !errors.As(err, &ve) || ve.Reason != "ContainerCreating" {
		t.Errorf("a request not issued yet: %v", err)
	}
}
