package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/release"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// SelfUpgrader replaces the node's own binary (main's release.Self).
type SelfUpgrader interface {
	// Version is the orch version running.
	Version() string
	// DownloadPath is where a release of version is downloaded.
	DownloadPath(version string) string
	// Swap installs the verified download of version on trial, to be
	// Ready within timeout, and restarts the process on it.
	Swap(file, version string, timeout time.Duration) error
	// OnTrial says the process runs an upgrade not yet kept.
	OnTrial() bool
	// Ready says the node runs Ready: a trial is kept; true when this
	// call kept it.
	Ready() bool
	// LastFailure is the last upgrade rolled back here and not yet
	// reported; MarkReported says the Node now says it, so that a later
	// start does not report it again into a new plan of that version.
	LastFailure() (release.Failure, bool)
	MarkReported() error
}

// annotateSelf says on the Node which orch the node runs, on which
// platform, and an upgrade it rolled back since it last said.
func annotateSelf(ctx context.Context, client *kube.Client, cfg Config) error {
	annotations := map[string]any{upgradeapi.VersionAnnotation: cfg.Version, upgradeapi.PlatformAnnotation: release.Platform(),
		upgradeapi.TrialAnnotation: nil}
	f, failed := release.Failure{}, false
	if cfg.Self != nil && cfg.Self.OnTrial() {
		annotations[upgradeapi.TrialAnnotation] = "true"
	}
	if cfg.Self != nil {
		f, failed = cfg.Self.LastFailure()
		if failed {
			annotations[upgradeapi.FailedAnnotation] = f.Version + ": " + f.Reason
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	if _, err := client.Nodes().Patch(ctx, cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate node %s: %w", cfg.NodeName, err)
	}
	if failed {
		return cfg.Self.MarkReported()
	}
	return nil
}

// keptUpgrade says on the Node that its trial ended: the upgrade loop
// takes the node as upgraded only then.
func keptUpgrade(ctx context.Context, client *kube.Client, name string) error {
	patch := []byte(`{"metadata":{"annotations":{"` + upgradeapi.TrialAnnotation + `":null}}}`)
	_, err := client.Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// followUpgrades watches the node's own Node for the upgrade loop's
// word (upgradeapi.TargetAnnotation) and carries it out: download the
// release from the API server, check it, swap it in, restart.
func followUpgrades(ctx context.Context, client *kube.Client, restConfig *rest.Config, cfg Config, log *slog.Logger) {
	httpClient, err := rest.HTTPClientFor(restConfig)
	if err != nil {
		log.Error("upgrades: no client for the API server", "err", err)
		return
	}
	u := &upgrader{http: httpClient, server: restConfig.Host, self: cfg.Self, client: client, node: cfg.NodeName, log: log}
	selector := fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
	for ctx.Err() == nil {
		w, err := client.Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			sleep(ctx, 5*time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if node, ok := ev.Object.(*corev1.Node); ok && u.wanted(node) {
				w.Stop()
				u.upgrade(ctx, node)
				break
			}
		}
		w.Stop()
		sleep(ctx, time.Second) // a watch the server ends is not a busy loop
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type upgrader struct {
	http   *http.Client
	server string
	self   SelfUpgrader
	client *kube.Client
	node   string
	log    *slog.Logger
}

// wanted says the node is told to run a version it does not, and has not
// rolled back.
func (u *upgrader) wanted(node *corev1.Node) bool {
	target := node.Annotations[upgradeapi.TargetAnnotation]
	return target != "" && target != u.self.Version() &&
		!strings.HasPrefix(node.Annotations[upgradeapi.FailedAnnotation], target+":")
}

// upgrade downloads, checks and installs the release the node is told to
// run; a download that fails is tried again (it resumes), a release that
// is not what the server said is reported and dropped.
func (u *upgrader) upgrade(ctx context.Context, node *corev1.Node) {
	target, sum := node.Annotations[upgradeapi.TargetAnnotation], node.Annotations[upgradeapi.SHA256Annotation]
	timeout := 10 * time.Minute
	if s, err := strconv.Atoi(node.Annotations[upgradeapi.TimeoutAnnotation]); err == nil && s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	bytesPerSecond, _ := strconv.ParseInt(node.Annotations[upgradeapi.RateAnnotation], 10, 64)
	log := u.log.With("from", u.self.Version(), "to", target)
	file := u.self.DownloadPath(target)
	log.Info("downloading the release", "bytesPerSecond", bytesPerSecond, "file", file)
	for attempt := 1; ctx.Err() == nil; attempt++ {
		start := time.Now()
		from, n, err := u.download(ctx, target, file, sum, bytesPerSecond)
		if err == nil {
			log.Info("release downloaded", "resumedAt", from, "bytes", n, "took", time.Since(start).Round(time.Millisecond))
			break
		}
		var bad badRelease
		if errors.As(err, &bad) {
			u.fail(ctx, target, err, file)
			return
		}
		log.Warn("downloading the release (resuming)", "attempt", attempt, "err", err)
		sleep(ctx, min(time.Duration(attempt)*2*time.Second, 30*time.Second))
	}
	if ctx.Err() != nil {
		return
	}
	b, err := release.Verify(ctx, file, release.Platform())
	if err == nil && b.Version != target {
		err = fmt.Errorf("the release says it is %s, not %s", b.Version, target)
	}
	if err != nil {
		u.fail(ctx, target, err, file)
		return
	}
	if err := u.self.Swap(file, target, timeout); err != nil {
		u.fail(ctx, target, err, file)
	}
}

// fail reports an upgrade the node could not take, so that the plan
// stops with the reason.
func (u *upgrader) fail(ctx context.Context, target string, err error, file string) {
	_ = os.Remove(file)
	u.log.Error("upgrade refused", "to", target, "err", err)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		upgradeapi.FailedAnnotation: target + ": " + err.Error()}}})
	if _, perr := u.client.Nodes().Patch(ctx, u.node, types.MergePatchType, patch, metav1.PatchOptions{}); perr != nil {
		u.log.Warn("reporting the refused upgrade", "err", perr)
	}
}

// badRelease is a download that is not the release the server named.
type badRelease struct{ error }

// download fetches the release into file, resuming what an earlier try
// left, at no more than bytesPerSecond (none: no cap), and checks its
// sum. It returns where it resumed and the bytes it received.
func (u *upgrader) download(ctx context.Context, version, file, sum string, bytesPerSecond int64) (from, received int64, err error) {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o700)
	if err != nil {
		return from, 0, err
	}
	defer func() { _ = f.Close() }()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return from, 0, err
	}
	if have > 0 && fileSum(f) == sum {
		return have, 0, nil // downloaded whole before a restart
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.server+upgradeapi.ReleasesPath+version+"/"+release.Platform(), nil)
	if err != nil {
		return from, 0, err
	}
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
		req.Header.Set("If-Range", `"`+sum+`"`)
	}
	resp, err := u.http.Do(req)
	if err != nil {
		return from, 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		from = have
	case http.StatusOK, http.StatusRequestedRangeNotSatisfiable:
		// A new file, or what was here is not a part of it: start over.
		if err := f.Truncate(0); err != nil {
			return from, 0, err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return from, 0, err
		}
		if resp.StatusCode != http.StatusOK {
			return from, 0, fmt.Errorf("the server refused the range of %s", file)
		}
	case http.StatusNotFound:
		return from, 0, badRelease{fmt.Errorf("the server holds no orch %s for %s", version, release.Platform())}
	default:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return from, 0, fmt.Errorf("download orch %s: %s: %s", version, resp.Status, strings.TrimSpace(string(body)))
	}
	if got := resp.Header.Get("X-Orch-Sha256"); got != "" && got != sum {
		return from, 0, badRelease{fmt.Errorf("the server's orch %s has sha256 %s, the plan names %s", version, got, sum)}
	}
	var body io.Reader = resp.Body
	if bytesPerSecond > 0 {
		body = &limitedReader{r: resp.Body, limit: rate.NewLimiter(rate.Limit(bytesPerSecond), int(min(bytesPerSecond, 256<<10))), ctx: ctx}
	}
	n, err := io.Copy(f, body)
	if err != nil {
		return from, n, err
	}
	if err := f.Sync(); err != nil {
		return from, n, err
	}
	if got := fileSum(f); got != sum {
		_ = f.Truncate(0)
		if from > 0 {
			// What an earlier try left may be what was wrong: once more,
			// whole.
			return from, n, fmt.Errorf("the resumed download of orch %s has sha256 %s, not the plan's: downloading it whole", version, got)
		}
		return from, n, badRelease{fmt.Errorf("the downloaded orch %s has sha256 %s, not the plan's %s", version, got, sum)}
	}
	return from, n, nil
}

// fileSum is the sha256 of the whole of f ("" when it cannot be read).
func fileSum(f *os.File) string {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return ""
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// limitedReader reads at most its limiter's rate.
type limitedReader struct {
	r     io.Reader
	limit *rate.Limiter
	ctx   context.Context
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if len(p) > l.limit.Burst() {
		p = p[:l.limit.Burst()]
	}
	n, err := l.r.Read(p)
	if n > 0 {
		if werr := l.limit.WaitN(l.ctx, n); werr != nil {
			return n, werr
		}
	}
	return n, err
}
