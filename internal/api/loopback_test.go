package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// TestLoopback: the loops' in-process client does what a network client
// does (CRUD, errors, informers that watch), and no more: validation still
// applies.
func TestLoopback(t *testing.T) {
	ts := startServer(t, "")
	client := kubernetes.NewForConfigOrDie(ts.srv.Loopback())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	factory := informers.NewSharedInformerFactory(client, 0)
	cms := factory.Core().V1().ConfigMaps()
	seen := make(chan string, 10)
	if _, err := cms.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { seen <- obj.(*corev1.ConfigMap).Name },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer func() { close(stop); factory.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), cms.Informer().HasSynced) {
		t.Fatal("informer over loopback never synced")
	}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "from-loops"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name := ""; name != "from-loops"; {
		select {
		case name = <-seen:
		case <-ctx.Done():
			t.Fatal("the informer never saw the loops' own write")
		}
	}
	if _, err := client.CoreV1().ConfigMaps("default").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get missing: %v", err)
	}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "Bad_Name"}}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("loops bypassed validation: %v", err)
	}
	if _, err := client.CoreV1().ConfigMaps("nowhere").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("loops bypassed namespace admission: %v", err)
	}
}

// TestReadyzWaitsForLoops: with WaitForLoops (orch server), /readyz says
// ready only once the control loops run.
func TestReadyzWaitsForLoops(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := api.New(ctx, api.Config{DataDir: dir, BindAddress: "127.0.0.1", AdvertiseAddress: "127.0.0.1", WaitForLoops: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	readyz := func() int {
		for range 100 {
			resp, err := insecureClient().Get(srv.URL() + "/readyz")
			if err == nil {
				_ = resp.Body.Close()
				return resp.StatusCode
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("server never answered")
		return 0
	}
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the loops started: %d", code)
	}
	srv.LoopsStarted()
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz once the loops run: %d", code)
	}
}
