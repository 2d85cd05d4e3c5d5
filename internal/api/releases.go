package api

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/orch-dev/orch/internal/api/rest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/release"
	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// The server keeps the orch binaries its nodes upgrade to (orch upgrade
// stage) in DATA/server/releases and serves them to the nodes at
// upgradeapi.ReleasesPath; the upgrade loop (internal/loops/upgrade)
// tells each node which to run.

// Releases is the server's store of release binaries.
func Releases(dataDir string) release.Store {
	return release.Store{Dir: filepath.Join(dataDir, "server", "releases")}
}

// ReleaseSum is the sha256 of the staged binary of version for platform
// (fetched from another server first when this one does not hold it).
func (s *Server) ReleaseSum(ctx context.Context, version, platform string) (string, error) {
	r, _, err := s.release(ctx, version, platform)
	if err != nil {
		return "", err
	}
	return r.SHA256, nil
}

// fromServerHeader marks a server's request for a release another server
// holds: it is answered from the store only, never fetched further.
const fromServerHeader = "X-Orch-Release-For-Server"

// release is the staged binary of version for platform. Servers sharing
// a datastore each keep the releases on their own disk: one staged on
// another server is fetched from it first (once, however many nodes ask
// at once), so that a release is staged once for the cluster.
func (s *Server) release(ctx context.Context, version, platform string) (release.Release, string, error) {
	store := Releases(s.cfg.DataDir)
	r, path, err := store.Get(version, platform)
	if !errors.Is(err, release.ErrNotStaged) || !s.sharedStore() {
		return r, path, err
	}
	s.releaseFetch.Lock()
	defer s.releaseFetch.Unlock()
	if r, path, err := store.Get(version, platform); !errors.Is(err, release.ErrNotStaged) {
		return r, path, err // another request fetched it meanwhile
	}
	if ferr := s.fetchRelease(ctx, version, platform); ferr != nil {
		s.log.Warn("fetching a release from the other servers", "version", version, "platform", platform, "err", ferr)
		return r, path, err
	}
	return store.Get(version, platform)
}

// fetchRelease copies a release from the first other server that holds
// it, as the admin, checking its sum on the way.
func (s *Server) fetchRelease(ctx context.Context, version, platform string) error {
	res, err := s.store.List(ctx, apiServersPrefix, store.ListOptions{})
	if err != nil {
		return err
	}
	cert, err := s.admin.TLS()
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.ca().Pool(), Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	var errs []error
	for _, kv := range res.KVs {
		peer, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, apiServersPrefix))
		if err != nil || peer == s.advertise {
			continue
		}
		u := "https://" + netip.AddrPortFrom(peer, uint16(s.port())).String() + upgradeapi.ReleasesPath + version + "/" + platform
		if err := s.fetchReleaseFrom(ctx, client, u, version); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", peer, err))
			continue
		}
		s.log.Info("release fetched from another server", "version", version, "platform", platform, "server", peer.String())
		return nil
	}
	if len(errs) == 0 {
		return fmt.Errorf("no other server")
	}
	return errors.Join(errs...)
}

func (s *Server) fetchReleaseFrom(ctx context.Context, client *http.Client, u, version string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set(fromServerHeader, "1")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	sum := resp.Header.Get("X-Orch-Sha256")
	dir := filepath.Join(s.cfg.DataDir, "server", "releases")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".fetch-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := io.Copy(tmp, resp.Body); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil { // Add runs it
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// The serving server checked it when it was staged; the sum says
	// this is the same file.
	_, err = Releases(s.cfg.DataDir).Add(ctx, tmp.Name(), map[string]string{filepath.Base(tmp.Name()): sum}, version)
	return err
}

// serveRelease answers GET /orch/releases/VERSION/PLATFORM with the
// binary (Range requests resume a download). Nodes may read it; other
// users as RBAC's non-resource rules say.
func (s *Server) serveRelease(w http.ResponseWriter, r *http.Request) {
	version, platform, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, upgradeapi.ReleasesPath), "/")
	var rel release.Release
	var path string
	var err error
	if r.Header.Get(fromServerHeader) != "" {
		rel, path, err = Releases(s.cfg.DataDir).Get(version, platform)
	} else {
		rel, path, err = s.release(r.Context(), version, platform)
	}
	if errors.Is(err, release.ErrNotStaged) {
		rest.WriteError(w, r, apierrors.NewNotFound(upgradeapi.GroupVersion.WithResource("releases").GroupResource(), version+"/"+platform))
		return
	}
	if err != nil {
		rest.WriteError(w, r, apierrors.NewInternalError(err))
		return
	}
	f, err := os.Open(path)
	if err != nil {
		rest.WriteError(w, r, apierrors.NewInternalError(err))
		return
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		rest.WriteError(w, r, apierrors.NewInternalError(err))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+rel.SHA256+`"`)
	w.Header().Set("X-Orch-Sha256", rel.SHA256)
	http.ServeContent(w, r, "orch", info.ModTime(), f)
}

// StageResult is what orch upgrade stage staged.
type StageResult struct {
	Staged []release.Release `json:"staged"`
}

// stage verifies and keeps the binaries at paths; a sha256sum.txt among
// them (or beside the first) checks the others.
func stage(ctx context.Context, dataDir string, paths []string) (StageResult, error) {
	if len(paths) == 0 {
		return StageResult{}, errors.New("no binary to stage")
	}
	var sums map[string]string
	var bins []string
	for _, p := range paths {
		if filepath.Base(p) == "sha256sum.txt" {
			var err error
			if sums, err = release.ReadSums(p); err != nil {
				return StageResult{}, err
			}
			continue
		}
		bins = append(bins, p)
	}
	if sums == nil {
		if s, err := release.ReadSums(filepath.Join(filepath.Dir(bins[0]), "sha256sum.txt")); err == nil {
			sums = s
			// Only a release's own files are checked against its sums.
			if _, named := sums[filepath.Base(bins[0])]; !named {
				sums = nil
			}
		}
	}
	// This machine's binary first: it says the release's version, which
	// another architecture's binary of the same release (its sum in the
	// same sha256sum.txt) may not be able to.
	sort.SliceStable(bins, func(i, j int) bool {
		return release.AssetPlatform(filepath.Base(bins[i])) == release.Platform() && release.AssetPlatform(filepath.Base(bins[j])) != release.Platform()
	})
	store := Releases(dataDir)
	var out StageResult
	version := ""
	for _, p := range bins {
		r, err := store.Add(ctx, p, sums, version)
		if err != nil {
			return out, err
		}
		if version == "" && r.Platform == release.Platform() {
			version = r.Version
		}
		out.Staged = append(out.Staged, r)
	}
	return out, nil
}

// StageReleases is `orch upgrade stage`: through the running server, or
// into its data dir when none runs.
func StageReleases(ctx context.Context, dataDir string, paths []string) (StageResult, error) {
	abs := make([]string, len(paths))
	for i, p := range paths {
		a, err := filepath.Abs(p)
		if err != nil {
			return StageResult{}, err
		}
		abs[i] = a
	}
	var out StageResult
	reached, err := control(ctx, dataDir, "/releases/stage", url.Values{"file": abs}, &out)
	if reached {
		return out, err
	}
	return stage(ctx, dataDir, abs)
}

// ApplyOptions are orch upgrade apply's.
type ApplyOptions struct {
	Version      string
	Concurrency  int32
	Selector     string
	Force        bool
	DrainForce   bool
	DeleteEmpty  bool
	DrainTimeout time.Duration
	NodeTimeout  time.Duration
}

// UpgradeStatus is orch upgrade status: the plans, newest last, and the
// releases staged.
type UpgradeStatus struct {
	Upgrades []upgradeapi.Upgrade `json:"upgrades"`
	Releases []release.Release    `json:"releases"`
}

// controlUpgrades serves orch upgrade's commands on the control socket.
func (s *Server) controlUpgrades(mux *http.ServeMux, reply func(http.ResponseWriter, any, error)) {
	mux.HandleFunc("POST /releases/stage", func(w http.ResponseWriter, r *http.Request) {
		out, err := stage(r.Context(), s.cfg.DataDir, r.URL.Query()["file"])
		for _, rel := range out.Staged {
			s.log.Info("release staged", "version", rel.Version, "platform", rel.Platform, "sha256", rel.SHA256)
		}
		reply(w, out, err)
	})
	mux.HandleFunc("POST /upgrades/apply", func(w http.ResponseWriter, r *http.Request) {
		var opts ApplyOptions
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&opts); err != nil {
			reply(w, nil, fmt.Errorf("the request: %w", err))
			return
		}
		u, err := s.applyUpgrade(r.Context(), opts)
		reply(w, u, err)
	})
	mux.HandleFunc("POST /upgrades/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := s.upgradeStatus(r.Context())
		reply(w, st, err)
	})
	mux.HandleFunc("POST /upgrades/pause", func(w http.ResponseWriter, r *http.Request) {
		reply(w, nil, s.pauseUpgrade(r.Context(), r.URL.Query().Get("name"), r.URL.Query().Get("paused") == "true"))
	})
}

func (s *Server) applyUpgrade(ctx context.Context, o ApplyOptions) (*upgradeapi.Upgrade, error) {
	client, err := kube.NewForConfig(s.adminLoopback())
	if err != nil {
		return nil, err
	}
	releases, err := Releases(s.cfg.DataDir).List()
	if err != nil {
		return nil, err
	}
	staged := false
	for _, r := range releases {
		staged = staged || r.Version == o.Version
	}
	if !staged {
		return nil, fmt.Errorf("orch %s is not staged on this server: orch upgrade stage its binaries first", o.Version)
	}
	list, err := client.Upgrades().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, u := range list.Items {
		if p := u.Status.Phase; p != upgradeapi.PhaseSucceeded && p != upgradeapi.PhaseFailed {
			return nil, fmt.Errorf("the upgrade %s (to %s) is under way: one plan runs at a time (orch upgrade status)", u.Name, u.Spec.Version)
		}
	}
	u := &upgradeapi.Upgrade{
		TypeMeta:   metav1.TypeMeta{APIVersion: upgradeapi.GroupVersion.String(), Kind: "Upgrade"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "to-" + strings.ReplaceAll(strings.ToLower(o.Version), "+", "-") + "-"},
		Spec: upgradeapi.UpgradeSpec{Version: o.Version, Concurrency: o.Concurrency, Force: o.Force,
			Drain: upgradeapi.DrainSpec{Force: o.DrainForce, DeleteEmptyDirData: o.DeleteEmpty}},
	}
	if o.Selector != "" {
		sel, err := metav1.ParseToLabelSelector(o.Selector)
		if err != nil {
			return nil, fmt.Errorf("--selector %q: %w", o.Selector, err)
		}
		u.Spec.NodeSelector = sel
	}
	if o.DrainTimeout > 0 {
		u.Spec.Drain.Timeout = &metav1.Duration{Duration: o.DrainTimeout}
	}
	if o.NodeTimeout > 0 {
		u.Spec.NodeTimeout = &metav1.Duration{Duration: o.NodeTimeout}
	}
	return client.Upgrades().Create(ctx, u, metav1.CreateOptions{})
}

func (s *Server) upgradeStatus(ctx context.Context) (UpgradeStatus, error) {
	client, err := kube.NewForConfig(s.adminLoopback())
	if err != nil {
		return UpgradeStatus{}, err
	}
	list, err := client.Upgrades().List(ctx, metav1.ListOptions{})
	if err != nil {
		return UpgradeStatus{}, err
	}
	out := UpgradeStatus{Upgrades: list.Items}
	out.Releases, err = Releases(s.cfg.DataDir).List()
	return out, err
}

// pauseUpgrade pauses (or resumes) the named plan, or the one under way.
func (s *Server) pauseUpgrade(ctx context.Context, name string, paused bool) error {
	client, err := kube.NewForConfig(s.adminLoopback())
	if err != nil {
		return err
	}
	if name == "" {
		list, err := client.Upgrades().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, u := range list.Items {
			if p := u.Status.Phase; p != upgradeapi.PhaseSucceeded && p != upgradeapi.PhaseFailed {
				name = u.Name
			}
		}
		if name == "" {
			return errors.New("no upgrade is under way")
		}
	}
	patch := []byte(`{"spec":{"paused":` + strconv.FormatBool(paused) + `}}`)
	_, err = client.Upgrades().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// controlUpgrade asks the running server on dataDir; an error when none
// runs (plans live in the cluster).
func controlUpgrade(ctx context.Context, dataDir, path string, query url.Values, body any, out any) error {
	reached, err := controlWithBody(ctx, dataDir, path, query, body, out)
	if !reached {
		return fmt.Errorf("no server answers on %s: start orch server first", ControlSocket(dataDir))
	}
	return err
}

// ApplyUpgrade is orch upgrade apply.
func ApplyUpgrade(ctx context.Context, dataDir string, o ApplyOptions) (*upgradeapi.Upgrade, error) {
	var u upgradeapi.Upgrade
	return &u, controlUpgrade(ctx, dataDir, "/upgrades/apply", nil, o, &u)
}

// GetUpgradeStatus is orch upgrade status.
func GetUpgradeStatus(ctx context.Context, dataDir string) (UpgradeStatus, error) {
	var st UpgradeStatus
	return st, controlUpgrade(ctx, dataDir, "/upgrades/status", nil, nil, &st)
}

// PauseUpgrade is orch upgrade pause (paused) and resume.
func PauseUpgrade(ctx context.Context, dataDir, name string, paused bool) error {
	var out any
	return controlUpgrade(ctx, dataDir, "/upgrades/pause", url.Values{"name": {name}, "paused": {strconv.FormatBool(paused)}}, nil, &out)
}

// markControlPlane labels this server's Node as a control plane's, as k3s
// does, once its agent has registered it: the upgrade loop upgrades such
// nodes first, and kubectl get nodes shows the role.
func (s *Server) markControlPlane(ctx context.Context) {
	client, err := kube.NewForConfig(s.Loopback())
	if err != nil {
		return
	}
	patch := []byte(`{"metadata":{"labels":{"` + upgradeapi.ControlPlaneLabel + `":"true"}}}`)
	for {
		node, err := client.Nodes().Get(ctx, s.cfg.NodeName, metav1.GetOptions{})
		if err == nil && node.Labels[upgradeapi.ControlPlaneLabel] == "true" {
			return
		}
		if err == nil {
			if _, err = client.Nodes().Patch(ctx, s.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// ServerReady asks the API server on another server's node whether it is
// ready (/readyz: its datastore answers, with several servers its etcd
// member is in the cluster): the upgrade loop starts the next server only
// then. The certificate is checked for the name every server's holds.
func (s *Server) ServerReady(ctx context.Context, node *corev1.Node) error {
	if node.Name == s.cfg.NodeName {
		return nil // this server, which is answering
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.ca().Pool(), ServerName: "kubernetes", MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	var errs []error
	for _, a := range node.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+netip.AddrPortFrom(ip, uint16(s.port())).String()+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %s", a.Address, strings.TrimSpace(string(body))))
	}
	if len(errs) == 0 {
		return fmt.Errorf("node %s has no address", node.Name)
	}
	return errors.Join(errs...)
}
