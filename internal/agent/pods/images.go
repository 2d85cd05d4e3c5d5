package pods

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/remotes"
	"github.com/containerd/containerd/remotes/docker"
	corev1 "k8s.io/api/core/v1"
)

// pulls remembers, per image and the credentials it is pulled with, the
// pull in flight (so that pods sharing an image pull it once) and the
// failures to back off from, as the kubelet's image manager does. The
// credentials are part of the key because a pull refused for one pod's
// credentials says nothing of another's: the kubelet keys its back-off
// by pod and image for the same reason.
type pulls struct {
	mu       sync.Mutex
	inFlight map[string]*pull
	failed   map[string]pullFailure
}

type pull struct {
	done chan struct{}
	err  error
}

type pullFailure struct {
	count int
	at    time.Time
	err   error
}

// pullBackoff is the kubelet's image pull back-off: 10 s doubling to
// five minutes.
func pullBackoff(failures int) time.Duration {
	return min(10*time.Second<<min(failures-1, 5), 5*time.Minute)
}

// image is a container's image on this node, pulled first when its
// imagePullPolicy asks (Always, or IfNotPresent when missing); failures
// are a configError (ErrImagePull, then ImagePullBackOff until the
// back-off has passed, ErrImageNeverPull). With Always and the registry
// unreachable, a copy already on the node is used: an edge node keeps
// its workloads when the network goes away.
func (m *Manager) image(ctx context.Context, pod *corev1.Pod, c corev1.Container) (containerd.Image, string, error) {
	ref, err := imageRef(c.Image)
	if err != nil {
		return nil, "", &configError{reason: "InvalidImageName", message: fmt.Sprintf("Failed to apply default image tag %q: %v", c.Image, err)}
	}
	m.touchImage(ref) // wanted from now: not collected while it is pulled
	cctx := m.ctx(ctx)
	local, err := m.ctr.Image(cctx, ref)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, ref, err
	}
	policy := c.ImagePullPolicy
	if policy == "" {
		policy = corev1.PullIfNotPresent
		if !strings.Contains(c.Image, "@") && (strings.HasSuffix(ref, ":latest")) {
			policy = corev1.PullAlways
		}
	}
	switch {
	case policy == corev1.PullNever && local == nil:
		m.event(pod, c.Name, corev1.EventTypeWarning, "ErrImageNeverPull", "Container image %q is not present with pull policy of Never", c.Image)
		m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: ErrImageNeverPull")
		return nil, ref, &configError{reason: "ErrImageNeverPull", message: fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)}
	case policy == corev1.PullNever, policy == corev1.PullIfNotPresent && local != nil:
		m.event(pod, c.Name, corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", c.Image)
		return local, ref, nil
	}
	// Read at each try, as the kubelet reads them at each sync: a secret
	// created after the pod is used, and one missing is said each time.
	creds := m.pullCredentials(ctx, pod)
	key := pullKey(ref, creds)
	if local != nil && !m.pulls.backingOff(key) {
		// A copy is here: ask the registry briefly before waiting on a
		// whole pull, so that an air-gapped node is not held up by DNS
		// and connection timeouts for each pod; the failure is kept for
		// the pull back-off, so the next pods do not ask at all.
		if err := m.reachable(ctx, creds, ref); err != nil && unreachable(err) {
			m.pulls.record(key, &configError{reason: "ErrImagePull", message: err.Error(), cause: err})
			m.log.Warn("the registry is unreachable: using the image's copy on the node", "image", ref, "err", err)
			m.event(pod, c.Name, corev1.EventTypeNormal, "Pulled", "Container image %q: the registry is unreachable, using the copy on the machine", c.Image)
			return local, ref, nil
		}
	}
	if !m.pulls.backingOff(key) {
		m.event(pod, c.Name, corev1.EventTypeNormal, "Pulling", "Pulling image %q", c.Image)
	}
	start := time.Now()
	img, err := m.pull(ctx, creds, ref, local == nil && policy == corev1.PullIfNotPresent)
	if err == nil {
		took := time.Since(start).Round(time.Millisecond)
		size, _ := img.Size(m.ctx(ctx))
		m.event(pod, c.Name, corev1.EventTypeNormal, "Pulled", "Successfully pulled image %q in %s (%s including waiting). Image size: %d bytes.", c.Image, took, took, size)
		return img, ref, nil
	}
	if local != nil && unreachable(err) {
		m.log.Warn("the registry is unreachable: using the image's copy on the node", "image", ref, "err", err)
		m.event(pod, c.Name, corev1.EventTypeNormal, "Pulled", "Container image %q: the registry is unreachable, using the copy on the machine", c.Image)
		return local, ref, nil
	}
	var ce *configError
	switch {
	case errors.As(err, &ce) && ce.reason == "ImagePullBackOff":
		m.event(pod, c.Name, corev1.EventTypeNormal, "BackOff", "Back-off pulling image %q", c.Image)
		m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: ImagePullBackOff")
	case errors.As(err, &ce):
		m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %v", c.Image, ce.cause)
		m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: ErrImagePull")
	}
	return nil, ref, err
}

// pullKey is what pulls are shared and backed off by: the image and the
// credentials its pull sends, hashed so that no password is kept as a
// map key.
func pullKey(ref string, creds map[string]credential) string {
	hosts := slices.Sorted(maps.Keys(creds))
	h := sha256.New()
	for _, host := range hosts {
		c := creds[host]
		_, _ = fmt.Fprintf(h, "%s\x00%s\x00%s\x00", host, c.user, c.pass) // a hash takes every write
	}
	return ref + "@" + hex.EncodeToString(h.Sum(nil))
}

// record counts a failed pull under key, for the back-off.
func (p *pulls) record(key string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.failed[key]
	p.failed[key] = pullFailure{count: f.count + 1, at: time.Now(), err: err}
}

// reachTimeout bounds asking a registry for an image the node has a copy
// of: a reachable registry answers a manifest request well within it.
const reachTimeout = 3 * time.Second

// reachable asks ref's registry (through the node's mirrors) for its
// manifest, giving up after reachTimeout.
func (m *Manager) reachable(ctx context.Context, creds map[string]credential, ref string) error {
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	_, _, err := m.resolver(creds).Resolve(ctx, ref)
	return err
}

// backingOff says whether pulls under key wait out a back-off after failing.
func (p *pulls) backingOff(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.failed[key]
	return ok && time.Since(f.at) < pullBackoff(f.count)
}

// unreachable reports a pull that failed for want of a network, not
// because the registry refused (credentials, a missing image): only then
// may a copy on the node stand in for the pull Always asks for.
func unreachable(err error) bool {
	for {
		var ce *configError
		if !errors.As(err, &ce) || ce.cause == nil {
			break
		}
		err = ce.cause
	}
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) || errors.As(err, &netErr) && netErr.Timeout()
}

// pull fetches ref from its registry with creds and unpacks it, once for
// all the pods that want it with the same credentials at the same time.
// ifMissing is IfNotPresent's pull: a pull of another pod's that ended
// since this pod found no image has brought it.
func (m *Manager) pull(ctx context.Context, creds map[string]credential, ref string, ifMissing bool) (containerd.Image, error) {
	p := &m.pulls
	key := pullKey(ref, creds)
	p.mu.Lock()
	if f, ok := p.failed[key]; ok && time.Since(f.at) < pullBackoff(f.count) {
		p.mu.Unlock()
		return nil, &configError{reason: "ImagePullBackOff", message: fmt.Sprintf("Back-off pulling image %q: %v", ref, f.err), cause: f.err}
	}
	if inFlight, ok := p.inFlight[key]; ok {
		p.mu.Unlock()
		select {
		case <-inFlight.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if inFlight.err != nil {
			return nil, inFlight.err
		}
		return m.ctr.Image(m.ctx(ctx), ref)
	}
	this := &pull{done: make(chan struct{})}
	p.inFlight[key] = this
	p.mu.Unlock()

	// A pull leaves inFlight only once its image is stored, so this look
	// finds any pull that ended before this one began.
	var img containerd.Image
	if ifMissing {
		img, _ = m.ctr.Image(m.ctx(ctx), ref) // not there, or not readable: pulled below
	}
	var err error
	if img == nil {
		m.log.Info("pulling image", "image", ref)
		start := time.Now()
		img, err = m.ctr.Pull(m.ctx(ctx), ref, m.resolver(creds))
		if err != nil {
			err = &configError{reason: "ErrImagePull", message: fmt.Sprintf("failed to pull and unpack image %q: %v (an air-gapped node takes image tarballs in %s)", ref, err, m.imagesDir()), cause: err}
		} else {
			m.log.Info("pulled image", "image", ref, "took", time.Since(start).Round(time.Millisecond))
		}
	}
	p.mu.Lock()
	delete(p.inFlight, key)
	p.mu.Unlock()
	if err != nil {
		p.record(key, err)
	} else {
		p.mu.Lock()
		delete(p.failed, key)
		p.mu.Unlock()
	}
	this.err = err
	close(this.done)
	return img, err
}

// resolver reaches registries as Docker does (HTTPS, plain HTTP for
// localhost), through the node's mirrors (registries.yaml), with creds
// (the pod's imagePullSecrets).
func (m *Manager) resolver(creds map[string]credential) remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: m.cfg.Registries.Hosts(func(host string) (string, string, bool) {
		c, ok := creds[host]
		return c.user, c.pass, ok
	})})
}

type credential struct{ user, pass string }

// pullCredentials are the pod's imagePullSecrets (kubernetes.io/
// dockerconfigjson or dockercfg) by registry host.
func (m *Manager) pullCredentials(ctx context.Context, pod *corev1.Pod) map[string]credential {
	out := map[string]credential{}
	src := m.sources(pod.Namespace)
	var failed []string
	for _, ref := range pod.Spec.ImagePullSecrets {
		sec, err := src.Secret(ctx, ref.Name)
		if err != nil || sec == nil {
			m.log.Warn("image pull secret not found", "pod", pod.Namespace+"/"+pod.Name, "secret", ref.Name, "err", err)
			failed = append(failed, ref.Name)
			continue
		}
		type entry struct {
			Username, Password, Auth string
		}
		// As the kubelet reads them: by the secret's type.
		auths := map[string]entry{}
		var parseErr error
		switch sec.Type {
		case corev1.SecretTypeDockerConfigJson:
			var cfg struct {
				Auths map[string]entry `json:"auths"`
			}
			parseErr = json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &cfg)
			auths = cfg.Auths
		case corev1.SecretTypeDockercfg:
			parseErr = json.Unmarshal(sec.Data[corev1.DockerConfigKey], &auths)
		}
		if parseErr != nil {
			// The API refuses such secrets now; one stored before it did
			// is said, not silently taken for no credentials.
			m.log.Warn("image pull secret does not parse", "pod", pod.Namespace+"/"+pod.Name, "secret", ref.Name, "err", parseErr)
			failed = append(failed, ref.Name)
			continue
		}
		for server, e := range auths {
			if e.Username == "" && e.Auth != "" {
				if dec, err := base64.StdEncoding.DecodeString(e.Auth); err == nil {
					e.Username, e.Password, _ = strings.Cut(string(dec), ":")
				}
			}
			host := strings.TrimPrefix(strings.TrimPrefix(server, "https://"), "http://")
			host, _, _ = strings.Cut(host, "/")
			if host == "index.docker.io" {
				host = "docker.io"
			}
			out[host] = credential{e.Username, e.Password}
		}
	}
	if len(failed) > 0 {
		m.event(pod, "", corev1.EventTypeWarning, "FailedToRetrieveImagePullSecret",
			"Unable to retrieve some image pull secrets (%s); attempting to pull the image may not succeed.", strings.Join(failed, ", "))
	}
	return out
}

// imagesDir is where air-gapped image tarballs go.
func (m *Manager) imagesDir() string { return filepath.Join(m.cfg.DataDir, "images") }
