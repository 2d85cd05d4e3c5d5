package api_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// TestProtobuf: clients that speak protobuf, as Kubernetes' own components
// do, get protobuf back: objects, lists, errors, watch streams, and
// metadata-only lists.
func TestProtobuf(t *testing.T) {
	ts := startServer(t, "")
	cfg := rest.CopyConfig(ts.config)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf" // no JSON fallback
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()

	w, err := client.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	created, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "pb", Labels: map[string]string{"enc": "protobuf"}}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := client.CoreV1().ConfigMaps("default").Get(ctx, "pb", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" || got.ResourceVersion != created.ResourceVersion {
		t.Fatalf("get: %+v %v", got, err)
	}
	list, err := client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: "enc=protobuf"})
	if err != nil || len(list.Items) != 1 || list.ResourceVersion == "" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if _, err := client.CoreV1().ConfigMaps("default").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("error over protobuf: %v", err)
	}
	got.Data["k"] = "v2"
	if _, err := client.CoreV1().ConfigMaps("default").Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		typ  watch.EventType
		data string
	}{{watch.Added, "v"}, {watch.Modified, "v2"}} {
		select {
		case ev := <-w.ResultChan():
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if ev.Type != want.typ || !ok || cm.Data["k"] != want.data {
				t.Fatalf("watch event %s %+v, want %s with %s", ev.Type, ev.Object, want.typ, want.data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s event", want.typ)
		}
	}

	// The metadata client asks for PartialObjectMetadataList in protobuf.
	mc, err := metadata.NewForConfig(ts.config)
	if err != nil {
		t.Fatal(err)
	}
	partial, err := mc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("default").List(ctx, metav1.ListOptions{LabelSelector: "enc=protobuf"})
	if err != nil || len(partial.Items) != 1 || partial.Items[0].Name != "pb" || partial.Items[0].Labels["enc"] != "protobuf" {
		t.Fatalf("metadata list: %+v %v", partial, err)
	}
	// Its watches get bookmarks as PartialObjectMetadata too, or it could
	// not decode them (the garbage collector's informers rely on it).
	mw, err := mc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("default").Watch(ctx,
		metav1.ListOptions{ResourceVersion: partial.ResourceVersion, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Stop()
	select {
	case ev := <-mw.ResultChan():
		if ev.Type != watch.Bookmark {
			t.Fatalf("metadata watch: %s %+v, want a bookmark", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no bookmark on a metadata watch")
	}
}

// TestManyWatchersShareEvents: watchers in JSON and protobuf, with and
// without selectors, all see every change of the objects they watch, while
// the server decodes and encodes each change once for all of them.
func TestManyWatchersShareEvents(t *testing.T) {
	ts := startServer(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pb := rest.CopyConfig(ts.config)
	pb.ContentType, pb.AcceptContentTypes = "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf"
	clients := []kubernetes.Interface{ts.client, kubernetes.NewForConfigOrDie(pb)}
	const watchers, changes = 20, 10
	results := make(chan int, watchers)
	for i := range watchers {
		opts := metav1.ListOptions{ResourceVersion: "1"}
		if i%4 == 0 {
			opts.LabelSelector = "watched=yes"
		}
		w, err := clients[i%2].CoreV1().ConfigMaps("default").Watch(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		go func() {
			seen := 0
			for ev := range w.ResultChan() {
				if cm, ok := ev.Object.(*corev1.ConfigMap); ok && cm.Name == "shared" {
					seen++
					if seen == changes {
						break
					}
				}
			}
			results <- seen
		}()
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "shared", Labels: map[string]string{"watched": "yes"}}, Data: map[string]string{}}
	cm, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < changes; i++ {
		cm.Data = map[string]string{"n": string(rune('0' + i))}
		if cm, err = ts.client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for range watchers {
		if seen := <-results; seen != changes {
			t.Fatalf("a watcher saw %d of %d changes", seen, changes)
		}
	}
}
