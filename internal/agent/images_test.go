package agent_test

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/agent/testimage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestImagePull: images not on the node are pulled from the registry
// their name points to (or its mirror in the node's registries.yaml),
// once for the pods that share one, with the pod's imagePullSecrets; failures are ErrImagePull then
// ImagePullBackOff with the registry's answer, and Never does not pull.
func TestImagePull(t *testing.T) {
	img, err := testimage.BuildBusybox("sh")
	if err != nil {
		t.Fatal(err)
	}
	// A site's cache of Docker Hub, over TLS with its own CA and a
	// password, named in the node's registries.yaml (k3s's format).
	cache := testimage.NewRegistry()
	cache.Put("library/tool", "1.0", img)
	cache.RequireAuth("cache-user", "cache-pass")
	cacheSrv := httptest.NewTLSServer(cache)
	defer cacheSrv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "cache-ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cacheSrv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	registries := filepath.Join(dir, "registries.yaml")
	if err := os.WriteFile(registries, fmt.Appendf(nil, "mirrors:\n  docker.io:\n    endpoint: [%q]\nconfigs:\n  %q:\n    auth: {username: cache-user, password: cache-pass}\n    tls: {ca_file: %q}\n",
		cacheSrv.URL, strings.TrimPrefix(cacheSrv.URL, "https://"), ca), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, "puller", func(c *agent.Config) { c.PrivateRegistry = registries })
	open := testimage.NewRegistry()
	open.Put("team/tool", "1.0", img)
	openSrv := httptest.NewServer(open)
	defer openSrv.Close()
	private := testimage.NewRegistry()
	private.Put("secret/tool", "2.0", img)
	private.Put("secret/tool", "3.0", img)
	private.RequireAuth("robot", "hunter2")
	privateSrv := httptest.NewServer(private)
	defer privateSrv.Close()
	openHost, privateHost := strings.TrimPrefix(openSrv.URL, "http://"), strings.TrimPrefix(privateSrv.URL, "http://")

	auth := base64.StdEncoding.EncodeToString([]byte("robot:hunter2"))
	if _, err := n.Client.CoreV1().Secrets("default").Create(n.Ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred"},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, privateHost, auth)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	withImage := func(name, image string, policy corev1.PullPolicy, secrets ...string) *corev1.Pod {
		c := agenttest.Busybox("main", "sleep 3600")
		c.Image, c.ImagePullPolicy = image, policy
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
		for _, s := range secrets {
			p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
		}
		return p
	}
	for i := range 3 {
		n.create(t, withImage(fmt.Sprintf("shared-%d", i), openHost+"/team/tool:1.0", corev1.PullIfNotPresent))
	}
	n.create(t, withImage("private", privateHost+"/secret/tool:2.0", corev1.PullIfNotPresent, "regcred"))
	n.create(t, withImage("no-secret", privateHost+"/secret/tool:3.0", corev1.PullAlways))
	n.create(t, withImage("absent-secret", privateHost+"/secret/tool:3.0", corev1.PullAlways, "nope"))
	n.create(t, withImage("missing", openHost+"/team/absent:1", corev1.PullIfNotPresent))
	n.create(t, withImage("never", openHost+"/team/never:1", corev1.PullNever))
	n.create(t, withImage("mirrored", "tool:1.0", corev1.PullIfNotPresent)) // Docker Hub, which this machine cannot reach

	waiting := func(name, reason, message string) {
		t.Helper()
		n.Eventually(name+" waiting "+reason, time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, name)
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
				return false, nil
			}
			w := p.Status.ContainerStatuses[0].State.Waiting
			return strings.Contains(reason, w.Reason) && strings.Contains(w.Message, message), nil
		})
	}
	for _, name := range []string{"shared-0", "shared-1", "shared-2", "private", "mirrored"} {
		n.Eventually(name+" Running from the registry", time.Minute, func(ctx context.Context) (bool, error) {
			return n.pod(ctx, name).Status.Phase == corev1.PodRunning, nil
		})
	}
	p := n.pod(n.Ctx, "shared-0")
	if want := openHost + "/team/tool@" + img.ManifestDigest(); p.Status.ContainerStatuses[0].ImageID != want {
		t.Errorf("imageID %q, want %q", p.Status.ContainerStatuses[0].ImageID, want)
	}
	if pulls := open.ManifestRequests(); pulls != 1 {
		t.Errorf("three pods of one image asked for its manifest %d times, want once", pulls)
	}
	waiting("no-secret", "ErrImagePull", "authorization failed")
	waiting("no-secret", "ImagePullBackOff", "Back-off pulling image")
	// The back-off is of a pull with those credentials: a pod of the same
	// image with the right secret pulls at once (the kubelet keys its
	// back-off by pod and image).
	n.create(t, withImage("with-secret", privateHost+"/secret/tool:3.0", corev1.PullAlways, "regcred"))
	n.Eventually("with-secret Running while no-secret backs off", 30*time.Second, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "with-secret").Status.Phase == corev1.PodRunning, nil
	})
	if events, err := n.Client.CoreV1().Events("default").List(n.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=with-secret"}); err != nil {
		t.Fatal(err)
	} else {
		for _, e := range events.Items {
			if e.Reason == "BackOff" {
				t.Errorf("with-secret waited out another pod's back-off: %s", e.Message)
			}
		}
	}
	// A pull secret that cannot be had is said, as the kubelet says it.
	waiting("absent-secret", "ErrImagePull or ImagePullBackOff", "")
	n.Eventually("the event naming the missing pull secret", time.Minute, func(ctx context.Context) (bool, error) {
		events, err := n.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=absent-secret"})
		if err != nil {
			return false, nil
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "FailedToRetrieveImagePullSecret" &&
				e.Message == "Unable to retrieve some image pull secrets (nope); attempting to pull the image may not succeed." {
				return true, nil
			}
		}
		return false, nil
	})
	waiting("missing", "ErrImagePull or ImagePullBackOff", "not found")
	waiting("never", "ErrImageNeverPull", "is not present with pull policy of Never")

	// The registry goes away: Always still starts a pod from the copy
	// on the node (an edge node keeps its workloads); an auth failure
	// above never did.
	privateSrv.Close()
	n.create(t, withImage("offline", privateHost+"/secret/tool:2.0", corev1.PullAlways, "regcred"))
	n.Eventually("offline Running from the node's copy", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "offline").Status.Phase == corev1.PodRunning, nil
	})

	// A :latest image (pull policy Always) whose registry stops answering
	// at all, as on a site whose uplink is down and whose DNS never
	// replies: the copy on the node is used after a brief try, not after
	// the pull's own timeouts, and the next pods do not try again while
	// the failure is fresh.
	latest := testimage.NewRegistry()
	latest.Put("team/app", "latest", img)
	latestSrv := httptest.NewServer(latest)
	latestHost := strings.TrimPrefix(latestSrv.URL, "http://")
	n.create(t, withImage("latest-1", latestHost+"/team/app", ""))
	n.Eventually("latest-1 Running, pulled", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "latest-1").Status.Phase == corev1.PodRunning, nil
	})
	latestSrv.Close()
	silent, err := net.Listen("tcp", latestHost)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	var tries atomic.Int32
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			tries.Add(1)
			held = append(held, c) // never answered
		}
	}()
	var asked []int32
	for _, name := range []string{"latest-2", "latest-3"} {
		n.create(t, withImage(name, latestHost+"/team/app", ""))
		n.Eventually(name+" Running from the node's copy", 30*time.Second, func(ctx context.Context) (bool, error) {
			return n.pod(ctx, name).Status.Phase == corev1.PodRunning, nil
		})
		asked = append(asked, tries.Load())
	}
	if asked[0] == 0 || asked[1] != asked[0] {
		t.Errorf("connections to the silent registry after each pod: %v, want some for the first and none more for the second", asked)
	}
}

// TestImageGC: once the disk is over the high threshold (here: any use at
// all), images no container uses are removed, as the kubelet's image
// garbage collection does; an image a running pod uses stays, and so
// does the one imported from the images directory (pinned: an air-gapped
// node could not pull it again).
func TestImageGC(t *testing.T) {
	n := startNode(t, "collector", func(c *agent.Config) {
		c.ImageGC = pods.ImageGC{HighPercent: math.SmallestNonzeroFloat64, LowPercent: math.SmallestNonzeroFloat64, MinAge: 2 * time.Second, Every: 200 * time.Millisecond}
	})
	img, err := testimage.BuildBusybox("sh")
	if err != nil {
		t.Fatal(err)
	}
	reg := testimage.NewRegistry()
	reg.Put("team/keep", "1", img)
	reg.Put("team/drop", "1", img)
	srv := httptest.NewServer(reg)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for name, image := range map[string]string{"keeper": host + "/team/keep:1", "dropper": host + "/team/drop:1"} {
		c := agenttest.Busybox("main", "sleep 3600")
		c.Image = image
		n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0), Containers: []corev1.Container{c}}})
		n.Eventually(name+" Running", time.Minute, func(ctx context.Context) (bool, error) {
			return n.pod(ctx, name).Status.Phase == corev1.PodRunning, nil
		})
	}
	if err := n.Client.CoreV1().Pods("default").Delete(n.Ctx, "dropper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ctr := agenttest.ContainerdClient(t, n.dir)
	nsCtx := namespaces.WithNamespace(n.Ctx, orchctr.Namespace)
	present := func(ref string) bool {
		_, err := ctr.GetImage(nsCtx, ref)
		return err == nil
	}
	n.Eventually("the unused image removed", time.Minute, func(context.Context) (bool, error) {
		return !present("docker.io/"+host+"/team/drop:1") && !present(host+"/team/drop:1"), nil
	})
	for _, ref := range []string{host + "/team/keep:1", "docker.io/library/busybox:test"} {
		if !present(ref) {
			t.Errorf("image %s was removed", ref)
		}
	}
	if p := n.pod(n.Ctx, "keeper"); p.Status.Phase != corev1.PodRunning {
		t.Errorf("the pod whose image stayed is %s", p.Status.Phase)
	}
}

// TestAirGapImagesInBeforeReady: the node says Ready only once the
// tarballs in its images directory are imported, as k3s imports its
// air-gap images before its kubelet starts; a pod scheduled at join must
// not go to a registry an air-gapped node cannot reach. The tarball here
// is a pipe fed two seconds late, as a large image read from an SD card.
func TestAirGapImagesInBeforeReady(t *testing.T) {
	c, dir := prepareNode(t)
	slow := filepath.Join(dir, "agent", "images", "slow.tar")
	if err := syscall.Mkfifo(slow, 0o644); err != nil {
		t.Fatal(err)
	}
	fed := make(chan error, 1)
	go func() {
		time.Sleep(2 * time.Second)
		fed <- testimage.WriteBusybox(slow, "docker.io/library/slow:1", "sh") // blocks until the agent reads
	}()
	n := startNodeIn(t, c, dir, "airgap")
	if err := <-fed; err != nil {
		t.Fatal(err)
	}
	ctr := agenttest.ContainerdClient(t, n.dir)
	if _, err := ctr.GetImage(namespaces.WithNamespace(n.Ctx, orchctr.Namespace), "docker.io/library/slow:1"); err != nil {
		t.Fatalf("the node is Ready before its air-gap image is in: %v", err)
	}
}
