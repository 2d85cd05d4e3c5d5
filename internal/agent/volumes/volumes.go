// Package volumes makes a pod's volumes on the node, as the kubelet's
// volume plugins do: emptyDir (on disk, or tmpfs for medium Memory),
// hostPath (with its type checked or created), the hostPath and local
// persistent volumes a pod's claims are bound to, and the projections of
// ConfigMaps, Secrets and the downward API, written atomically (a
// ..data symlink swapped over a timestamped directory) so that a mounted
// directory follows its source without a reader seeing half an update.
// Secrets live in tmpfs only: an SD card keeps what it is given. Mounts
// turns a container's volumeMounts into OCI bind mounts (subPath,
// propagation, read-only).
package volumes

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/orch-dev/orch/internal/localpath"
	"golang.org/x/sys/unix"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// Paths are a pod's volumes by name, as paths on the node.
type Paths map[string]Path

// Path is one volume on the node.
type Path struct {
	Path string
	// API is set for volumes Kubernetes always mounts read-only: those
	// projected from the API.
	API bool
	// ReadOnly is a claim the pod mounts read-only.
	ReadOnly bool
}

// Error is a volume the pod cannot have as its spec and sources stand:
// the container waits with Reason (ContainerCreating,
// CreateContainerConfigError) and Message, and is tried again.
type Error struct{ Reason, Message string }

func (e *Error) Error() string { return e.Reason + ": " + e.Message }

// Sources are the ConfigMaps and Secrets of the pod's namespace (a
// missing one is nil, not an error) and the tokens of its service
// account.
type Sources interface {
	ConfigMap(ctx context.Context, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, name string) (*corev1.Secret, error)
	ServiceAccountToken(ctx context.Context, pod *corev1.Pod, p *corev1.ServiceAccountTokenProjection) (string, error)
	// PersistentVolumeClaim and PersistentVolume are nil when missing.
	PersistentVolumeClaim(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error)
	PersistentVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error)
	// KeepLocalVolume records a local-path volume the node is about to
	// make, so that it can remove the data once the volume is deleted.
	KeepLocalVolume(pv *corev1.PersistentVolume) error
	// ClusterTrustBundle is the named bundle, nil when missing;
	// ClusterTrustBundles are a signer's bundles a label selector picks.
	ClusterTrustBundle(ctx context.Context, name string) (*certificatesv1.ClusterTrustBundle, error)
	ClusterTrustBundles(ctx context.Context, signer string, selector labels.Selector) ([]certificatesv1.ClusterTrustBundle, error)
	// PodCertificate is the key (PEM) and certificate chain of a
	// podCertificate source (the source's index in the named volume), or
	// an *Error while its PodCertificateRequest waits for its signer.
	PodCertificate(ctx context.Context, pod *corev1.Pod, volume string, index int, p *corev1.PodCertificateProjection) (key, chain []byte, err error)
	// ImageVolume mounts the image an image volume names, pulled as its
	// pull policy says, read only at dir.
	ImageVolume(ctx context.Context, pod *corev1.Pod, name string, v *corev1.ImageVolumeSource, dir string) error
}

// Fields are the downward API's values: a pod's fields and a container's
// resources (c nil for volumes, which name theirs).
type Fields interface {
	PodField(pod *corev1.Pod, path string) (string, error)
	ResourceField(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error)
}

// SetUp makes (or refreshes) the pod's volumes under root. Projections
// of ConfigMaps, Secrets and the downward API are rewritten atomically
// when their content changed, as the kubelet does, so a mounted directory
// follows its ConfigMap. Errors the pod's spec or sources cause are
// *Error.
func SetUp(ctx context.Context, root string, src Sources, fields Fields, pod *corev1.Pod) (Paths, error) {
	p := projector{src: src, fields: fields}
	out := Paths{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(root, v.Name)
		fail := func(err error) error {
			var ve *Error
			if errors.As(err, &ve) {
				return err
			}
			return &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", v.Name, err)}
		}
		var files map[string]projectedFile
		var err error
		switch {
		case v.EmptyDir != nil:
			if err := setUpEmptyDir(dir, v.EmptyDir, fsGroup(pod)); err != nil {
				return nil, fail(err)
			}
			out[v.Name] = Path{Path: dir}
			continue
		case v.HostPath != nil:
			if err := checkHostPath(v.HostPath); err != nil {
				return nil, fail(err)
			}
			out[v.Name] = Path{Path: v.HostPath.Path}
			continue
		case v.PersistentVolumeClaim != nil:
			path, err := p.claimPath(ctx, pod, v.PersistentVolumeClaim.ClaimName)
			if err != nil {
				var ve *Error
				if target, lerr := os.Readlink(dir); lerr == nil && !errors.As(err, &ve) {
					// The API cannot be asked: the volume the claim was
					// bound to before is still it (a binding never moves).
					out[v.Name] = Path{Path: target, ReadOnly: v.PersistentVolumeClaim.ReadOnly}
					continue
				}
				return nil, fail(err)
			}
			if err := link(path, dir); err != nil {
				return nil, fail(err)
			}
			out[v.Name] = Path{Path: path, ReadOnly: v.PersistentVolumeClaim.ReadOnly}
			continue
		case v.Image != nil:
			if err := src.ImageVolume(ctx, pod, v.Name, v.Image, dir); err != nil {
				return nil, fail(err)
			}
			out[v.Name] = Path{Path: dir, ReadOnly: true}
			continue
		case v.ConfigMap != nil:
			files, err = p.configMapFiles(ctx, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, modeOr(v.ConfigMap.DefaultMode))
		case v.Secret != nil:
			files, err = p.secretFiles(ctx, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, modeOr(v.Secret.DefaultMode))
		case v.DownwardAPI != nil:
			files, err = p.downwardFiles(pod, v.DownwardAPI.Items, modeOr(v.DownwardAPI.DefaultMode))
		case v.Projected != nil:
			files, err = p.projectedFiles(ctx, pod, v.Name, v.Projected)
		default:
			return nil, fail(&Error{Reason: "ContainerCreating", Message: fmt.Sprintf("volume %q: only emptyDir, hostPath, persistentVolumeClaim, configMap, secret, downwardAPI, projected and image volumes are supported", v.Name)})
		}
		if err != nil {
			var ve *Error
			if !errors.As(err, &ve) && hasProjection(dir) {
				// The API cannot be asked (the server is away): the volume
				// keeps what it holds, the last token among it, as the
				// kubelet keeps a volume it cannot refresh.
				out[v.Name] = Path{Path: dir, API: true}
				continue
			}
			return nil, fail(err)
		}
		// Secrets never touch the node's disk (an SD card keeps what it
		// is given): their volumes are tmpfs, as in Kubernetes.
		inMemory := v.Secret != nil || v.Projected != nil
		if err := writeProjection(dir, files, inMemory, fsGroup(pod)); err != nil {
			return nil, fail(err)
		}
		out[v.Name] = Path{Path: dir, API: true}
	}
	return out, nil
}

// claimPath is where the volume bound to the claim lives on this node:
// a hostPath volume's path (made if its type says so; a local-path one
// recorded first, so that its data can be removed with it) or a local
// volume's, which must exist.
func (p projector) claimPath(ctx context.Context, pod *corev1.Pod, name string) (string, error) {
	pvc, err := p.src.PersistentVolumeClaim(ctx, name)
	if err != nil {
		return "", err
	}
	if pvc == nil {
		return "", &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("error processing PVC %s/%s: persistentvolumeclaim %q not found", pod.Namespace, name, name)}
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("error processing PVC %s/%s: PVC is not bound", pod.Namespace, name)}
	}
	pv, err := p.src.PersistentVolume(ctx, pvc.Spec.VolumeName)
	if err != nil {
		return "", err
	}
	if pv == nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		return "", &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("error processing PVC %s/%s: volume %q is not bound to it", pod.Namespace, name, pvc.Spec.VolumeName)}
	}
	switch {
	case pv.Spec.HostPath != nil:
		if localpath.Provisioned(pv) {
			if err := p.src.KeepLocalVolume(pv); err != nil {
				return "", err
			}
			if err := makeSharedDir(pv.Spec.HostPath.Path); err != nil {
				return "", err
			}
		}
		if err := checkHostPath(pv.Spec.HostPath); err != nil {
			return "", err
		}
		return pv.Spec.HostPath.Path, nil
	case pv.Spec.Local != nil:
		if _, err := os.Stat(pv.Spec.Local.Path); err != nil {
			return "", &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("MountVolume.NewMounter initialization failed for volume %q : path %q does not exist", pv.Name, pv.Spec.Local.Path)}
		}
		return pv.Spec.Local.Path, nil
	}
	return "", &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("volume %q: only hostPath and local persistent volumes can be mounted on this node", pv.Name)}
}

// makeSharedDir makes a local-path volume's directory writable by any
// user, as rancher's provisioner does (mkdir -m 0777): the pod's
// processes need not run as root to use their claim.
func makeSharedDir(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(path, 0o777); err != nil {
		return err
	}
	return os.Chmod(path, 0o777) // past the umask
}

// link points dir, the pod's own name for a claim's volume, at path: it
// stands in for the API when the pod starts again with the server away.
func link(path, dir string) error {
	if target, err := os.Readlink(dir); err == nil && target == path {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o750); err != nil {
		return err
	}
	tmp := dir + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(path, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

func modeOr(mode *int32) fs.FileMode {
	if mode == nil {
		return 0o644
	}
	return fs.FileMode(*mode)
}

func fsGroup(pod *corev1.Pod) *int64 {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	return pod.Spec.SecurityContext.FSGroup
}

// setUpEmptyDir makes an emptyDir: a directory everyone may write, in
// memory (tmpfs, with its size limit) for medium Memory. With the pod's
// fsGroup it belongs to that group and is setgid, so that what the
// containers write there does too, as the kubelet sets volume ownership.
func setUpEmptyDir(dir string, v *corev1.EmptyDirVolumeSource, fsGroup *int64) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if v.Medium == corev1.StorageMediumMemory && !IsMountPoint(dir) {
		opts := "mode=0777"
		if v.SizeLimit != nil && !v.SizeLimit.IsZero() {
			opts += fmt.Sprintf(",size=%d", v.SizeLimit.Value())
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
		}
	}
	mode := os.FileMode(0o777)
	if fsGroup != nil {
		if err := os.Chown(dir, -1, int(*fsGroup)); err != nil {
			return err
		}
		mode |= os.ModeSetgid
	}
	return os.Chmod(dir, mode)
}

// checkHostPath applies the hostPath volume's type, creating what
// DirectoryOrCreate and FileOrCreate ask for.
func checkHostPath(v *corev1.HostPathVolumeSource) error {
	typ := corev1.HostPathUnset
	if v.Type != nil {
		typ = *v.Type
	}
	fi, err := os.Stat(v.Path)
	switch typ {
	case corev1.HostPathUnset:
		return nil
	case corev1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(v.Path, 0o755)
		}
	case corev1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(v.Path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(v.Path, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("hostPath type check failed: %w", err)
	}
	want := map[corev1.HostPathType]fs.FileMode{
		corev1.HostPathDirectoryOrCreate: fs.ModeDir, corev1.HostPathDirectory: fs.ModeDir,
		corev1.HostPathFileOrCreate: 0, corev1.HostPathFile: 0,
		corev1.HostPathSocket: fs.ModeSocket, corev1.HostPathCharDev: fs.ModeDevice | fs.ModeCharDevice, corev1.HostPathBlockDev: fs.ModeDevice,
	}
	mode, ok := want[typ]
	if !ok {
		return fmt.Errorf("hostPath type %q is not one of Kubernetes' types", typ)
	}
	if fi.Mode().Type() != mode {
		return fmt.Errorf("hostPath type check failed: %s is not a %s", v.Path, strings.TrimPrefix(string(typ), "OrCreate"))
	}
	return nil
}

// projectedFile is one file of a projected volume.
type projectedFile struct {
	data []byte
	mode fs.FileMode
}

// projector reads what projected volumes hold.
type projector struct {
	src    Sources
	fields Fields
}

// keyFiles are a ConfigMap's or Secret's keys as files: every key, or the
// items asked for.
func keyFiles(data map[string][]byte, items []corev1.KeyToPath, mode fs.FileMode, what string, optional bool) (map[string]projectedFile, error) {
	files := map[string]projectedFile{}
	if len(items) == 0 {
		for k, v := range data {
			files[k] = projectedFile{data: v, mode: mode}
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s references non-existent key: %s", what, it.Key)
		}
		f := projectedFile{data: v, mode: mode}
		if it.Mode != nil {
			f.mode = fs.FileMode(*it.Mode)
		}
		files[it.Path] = f
	}
	return files, nil
}

func (p projector) configMapFiles(ctx context.Context, name string, items []corev1.KeyToPath, optional *bool, mode fs.FileMode) (map[string]projectedFile, error) {
	cm, err := p.src.ConfigMap(ctx, name)
	if err != nil {
		return nil, err
	}
	if cm == nil {
		if ptr.Deref(optional, false) {
			return map[string]projectedFile{}, nil
		}
		return nil, fmt.Errorf("configmap %q not found", name)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	maps.Copy(data, cm.BinaryData)
	return keyFiles(data, items, mode, "configmap", ptr.Deref(optional, false))
}

func (p projector) secretFiles(ctx context.Context, name string, items []corev1.KeyToPath, optional *bool, mode fs.FileMode) (map[string]projectedFile, error) {
	sec, err := p.src.Secret(ctx, name)
	if err != nil {
		return nil, err
	}
	if sec == nil {
		if ptr.Deref(optional, false) {
			return map[string]projectedFile{}, nil
		}
		return nil, fmt.Errorf("secret %q not found", name)
	}
	return keyFiles(sec.Data, items, mode, "secret", ptr.Deref(optional, false))
}

func (p projector) downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode fs.FileMode) (map[string]projectedFile, error) {
	files := map[string]projectedFile{}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = p.fields.PodField(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = p.fields.ResourceField(pod, nil, it.ResourceFieldRef)
		}
		if err != nil {
			return nil, err
		}
		f := projectedFile{data: []byte(v), mode: mode}
		if it.Mode != nil {
			f.mode = fs.FileMode(*it.Mode)
		}
		files[it.Path] = f
	}
	return files, nil
}

func (p projector) projectedFiles(ctx context.Context, pod *corev1.Pod, volume string, v *corev1.ProjectedVolumeSource) (map[string]projectedFile, error) {
	mode := modeOr(v.DefaultMode)
	files := map[string]projectedFile{}
	for i, s := range v.Sources {
		var more map[string]projectedFile
		var err error
		switch {
		case s.PodCertificate != nil:
			more, err = p.podCertificateFiles(ctx, pod, volume, i, s.PodCertificate, mode)
		case s.ConfigMap != nil:
			more, err = p.configMapFiles(ctx, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, mode)
		case s.Secret != nil:
			more, err = p.secretFiles(ctx, s.Secret.Name, s.Secret.Items, s.Secret.Optional, mode)
		case s.DownwardAPI != nil:
			more, err = p.downwardFiles(pod, s.DownwardAPI.Items, mode)
		case s.ServiceAccountToken != nil:
			more, err = p.tokenFiles(ctx, pod, s.ServiceAccountToken, mode)
		case s.ClusterTrustBundle != nil:
			more, err = p.trustBundleFiles(ctx, s.ClusterTrustBundle, mode)
		default:
			return nil, &Error{Reason: "ContainerCreating", Message: "projected volumes support configMap, secret, downwardAPI, serviceAccountToken, clusterTrustBundle and podCertificate sources"}
		}
		if err != nil {
			return nil, err
		}
		maps.Copy(files, more)
	}
	return files, nil
}

// tokenFiles is a projected service-account token: the node asks the
// API for it, bound to the pod.
func (p projector) tokenFiles(ctx context.Context, pod *corev1.Pod, t *corev1.ServiceAccountTokenProjection, mode fs.FileMode) (map[string]projectedFile, error) {
	token, err := p.src.ServiceAccountToken(ctx, pod, t)
	if err != nil {
		return nil, fmt.Errorf("service account token for %q: %w", pod.Spec.ServiceAccountName, err)
	}
	return map[string]projectedFile{t.Path: {data: []byte(token), mode: mode}}, nil
}

// trustBundleFiles is a clusterTrustBundle projection, as the kubelet
// writes it: the certificates of the named bundle, or of every bundle of
// the signer the label selector picks (a nil selector picks none, an
// empty one all), each once, in a stable order. A missing bundle (or no
// match) is an empty file when the source is optional, an error
// otherwise.
func (p projector) trustBundleFiles(ctx context.Context, src *corev1.ClusterTrustBundleProjection, mode fs.FileMode) (map[string]projectedFile, error) {
	optional := src.Optional != nil && *src.Optional
	var bundles []certificatesv1.ClusterTrustBundle
	switch {
	case src.Name != nil:
		b, err := p.src.ClusterTrustBundle(ctx, *src.Name)
		if err != nil {
			return nil, fmt.Errorf("clustertrustbundle %q: %w", *src.Name, err)
		}
		if b == nil && !optional {
			return nil, &Error{Reason: "ContainerCreating", Message: fmt.Sprintf("clustertrustbundle %q not found", *src.Name)}
		}
		if b != nil {
			bundles = append(bundles, *b)
		}
	case src.SignerName != nil:
		// A nil selector picks no bundle, an empty one every bundle.
		if src.LabelSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(src.LabelSelector)
			if err != nil {
				return nil, &Error{Reason: "CreateContainerConfigError", Message: fmt.Sprintf("clusterTrustBundle label selector: %v", err)}
			}
			if bundles, err = p.src.ClusterTrustBundles(ctx, *src.SignerName, sel); err != nil {
				return nil, fmt.Errorf("clustertrustbundles of %q: %w", *src.SignerName, err)
			}
		}
		if len(bundles) == 0 && !optional {
			return nil, &Error{Reason: "ContainerCreating", Message: "combination of signerName and labelSelector matched zero ClusterTrustBundles"}
		}
	}
	seen := map[string]bool{}
	var anchors []string
	for _, b := range bundles {
		rest := []byte(b.Spec.TrustBundle)
		for {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			if !seen[string(block.Bytes)] {
				seen[string(block.Bytes)] = true
				anchors = append(anchors, string(block.Bytes))
			}
		}
	}
	slices.Sort(anchors)
	var data []byte
	for _, a := range anchors {
		data = append(data, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(a)})...)
	}
	return map[string]projectedFile{src.Path: {data: data, mode: mode}}, nil
}

// podCertificateFiles is a podCertificate projection, as the kubelet
// writes it: the credential bundle (the key, then the chain), the key and
// the chain, at the paths the source names.
func (p projector) podCertificateFiles(ctx context.Context, pod *corev1.Pod, volume string, index int, src *corev1.PodCertificateProjection, mode fs.FileMode) (map[string]projectedFile, error) {
	key, chain, err := p.src.PodCertificate(ctx, pod, volume, index, src)
	if err != nil {
		return nil, err
	}
	files := map[string]projectedFile{}
	if src.CredentialBundlePath != "" {
		files[src.CredentialBundlePath] = projectedFile{data: append(slices.Clone(key), chain...), mode: mode}
	}
	if src.KeyPath != "" {
		files[src.KeyPath] = projectedFile{data: key, mode: mode}
	}
	if src.CertificateChainPath != "" {
		files[src.CertificateChainPath] = projectedFile{data: chain, mode: mode}
	}
	return files, nil
}

// hasProjection reports whether dir holds a projection already.
func hasProjection(dir string) bool {
	_, err := os.Readlink(filepath.Join(dir, "..data"))
	return err == nil
}

// writeProjection writes files into dir the way the kubelet's atomic
// writer does: the data lives in a timestamped directory that the
// ..data symlink names, and each top-level name is a symlink through
// ..data, so a reader never sees half an update. Unchanged content is not
// rewritten.
func writeProjection(dir string, files map[string]projectedFile, inMemory bool, group *int64) error {
	for p := range files {
		if filepath.IsAbs(p) || slices.Contains(strings.Split(p, "/"), "..") || strings.HasPrefix(p, "..") {
			return fmt.Errorf("invalid path %q in volume", p)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if inMemory && !IsMountPoint(dir) {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
		}
	}
	dataLink := filepath.Join(dir, "..data")
	old, _ := os.Readlink(dataLink)
	if old != "" && sameFiles(filepath.Join(dir, old), files) {
		return nil
	}
	ts := filepath.Join(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05.000000000"))
	if err := os.Mkdir(ts, 0o755); err != nil {
		return err
	}
	for p, f := range files {
		path := filepath.Join(ts, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, f.data, f.mode.Perm()); err != nil {
			return err
		}
		if err := os.Chmod(path, f.mode.Perm()); err != nil {
			return err
		}
		if group != nil {
			if err := os.Lchown(path, -1, int(*group)); err != nil {
				return err
			}
		}
	}
	tmpLink := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmpLink)
	if err := os.Symlink(filepath.Base(ts), tmpLink); err != nil {
		return err
	}
	if err := os.Rename(tmpLink, dataLink); err != nil {
		return err
	}
	top := map[string]bool{}
	for p := range files {
		top[strings.Split(p, "/")[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == "..data" || name == filepath.Base(ts):
		case strings.HasPrefix(name, ".."):
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
				return err
			}
		case !top[name]:
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameFiles reports whether dir holds exactly files.
func sameFiles(dir string, files map[string]projectedFile) bool {
	n := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		f, ok := files[rel]
		if !ok {
			return fs.ErrNotExist
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(data, f.data) || fi.Mode().Perm() != f.mode.Perm() {
			return fs.ErrNotExist
		}
		n++
		return nil
	})
	return err == nil && n == len(files)
}

// IsMountPoint reports whether something is mounted at dir.
func IsMountPoint(dir string) bool {
	var st, parent syscall.Stat_t
	if syscall.Stat(dir, &st) != nil || syscall.Stat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	if st.Dev != parent.Dev {
		return true
	}
	// A bind mount from the same filesystem (an image volume's view of a
	// one-layer image) keeps the device: the kernel's table says.
	mounted, err := mountinfo.Mounted(dir)
	return err == nil && mounted
}

// TearDown unmounts the in-memory volumes SetUp made under root and
// removes root. hostPath volumes and the data of claims are not in it.
func TearDown(root string) error {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		// A claim's link leads to the volume's data, which may be a disk
		// mounted there: never unmounted nor followed.
		if e.Type()&fs.ModeSymlink == 0 && IsMountPoint(dir) {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount volume %s: %w", dir, err)
			}
		}
	}
	return os.RemoveAll(root)
}

// Mounts are a container's volume mounts as OCI mounts; mounts the pod's
// volumes do not allow are *Error.
func Mounts(c *corev1.Container, vols Paths) ([]specs.Mount, error) {
	var out []specs.Mount
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			return nil, &Error{Reason: "CreateContainerConfigError", Message: fmt.Sprintf("volumeMount %q names no volume of the pod", vm.Name)}
		}
		source := v.Path
		if vm.SubPath != "" {
			var err error
			if source, err = subPath(v.Path, vm.SubPath); err != nil {
				return nil, &Error{Reason: "CreateContainerConfigError", Message: fmt.Sprintf("failed to prepare subPath for volumeMount %q of container %q: %v", vm.Name, c.Name, err)}
			}
		}
		opts := []string{"rbind"}
		switch {
		case vm.MountPropagation == nil || *vm.MountPropagation == corev1.MountPropagationNone:
			opts = append(opts, "rprivate")
		case *vm.MountPropagation == corev1.MountPropagationHostToContainer:
			opts = append(opts, "rslave")
		case *vm.MountPropagation == corev1.MountPropagationBidirectional:
			opts = append(opts, "rshared")
		}
		if vm.ReadOnly || v.API || v.ReadOnly {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: source, Options: opts})
	}
	return out, nil
}

// subPath resolves a subPath inside a volume, creating it as a directory
// when missing, and refuses one that leads outside the volume.
func subPath(volume, sub string) (string, error) {
	if filepath.IsAbs(sub) || slices.Contains(strings.Split(filepath.ToSlash(sub), "/"), "..") {
		return "", fmt.Errorf("subPath %q must be a relative path without '..'", sub)
	}
	path := filepath.Join(volume, sub)
	if _, err := os.Lstat(path); os.IsNotExist(err) {
		if err := os.MkdirAll(path, 0o755); err != nil {
			return "", err
		}
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	base, err := filepath.EvalSymlinks(volume)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(base, resolved); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("subPath %q leads outside its volume", sub)
	}
	return resolved, nil
}
