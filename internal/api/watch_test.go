package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/orch-dev/orch/internal/api"
)

func TestWatchFromResourceVersionAndBookmarks(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	c1, err := cms.Create(ctx, configMap("w1", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: c1.ResourceVersion, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := cms.Create(ctx, configMap("w2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		typ  watch.EventType
		name string
	}{{watch.Added, "w2"}, {watch.Deleted, "w1"}}
	sawBookmark := false
	deadline := time.After(5 * time.Second)
	for len(want) > 0 || !sawBookmark {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Bookmark {
				sawBookmark = true
				continue
			}
			cm := ev.Object.(*corev1.ConfigMap)
			if len(want) == 0 || ev.Type != want[0].typ || cm.Name != want[0].name {
				t.Fatalf("event %s %s, want %v", ev.Type, cm.Name, want)
			}
			want = want[1:]
		case <-deadline:
			t.Fatalf("missing events %v (bookmark seen: %v)", want, sawBookmark)
		}
	}
}

func TestWatchGoneAfterCompaction(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	code, body, _ := ts.rawRequest(t, "GET", "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1&timeoutSeconds=1", "", "")
	if code != 200 {
		t.Fatalf("watch from 1 before compaction: %d %s", code, body)
	}
	for i := 0; i < 3; i++ {
		if _, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, configMap(fmt.Sprintf("c%d", i), nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ts.compact(t)
	// Kubernetes sends an ERROR event with a 410 Status for compacted history.
	code, body, _ = ts.rawRequest(t, "GET", "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1", "", "")
	var ev metav1.WatchEvent
	if code != 200 || json.Unmarshal([]byte(body), &ev) != nil || ev.Type != "ERROR" {
		t.Fatalf("watch from a compacted revision: %d %s", code, body)
	}
	var st metav1.Status
	if err := json.Unmarshal(ev.Object.Raw, &st); err != nil || st.Code != 410 || st.Reason != metav1.StatusReasonExpired {
		t.Fatalf("error event: %s", ev.Object.Raw)
	}
}

// A resourceVersion the store has not reached (from another store: a
// datastore the cluster moved into, a restored snapshot) gets Kubernetes'
// "Too large resource version", on which client-go lists again, and not a
// watch silent until the store gets there; with and without the cache.
func TestWatchFromTheFuture(t *testing.T) {
	for _, cache := range []bool{true, false} {
		t.Run(fmt.Sprintf("cache=%v", cache), func(t *testing.T) {
			ts := startServerWith(t, "", 0, func(c *api.Config) { c.DisableWatchCache = !cache })
			ctx := context.Background()
			cm, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, configMap("now", nil), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
			for _, future := range []int64{rv + 1000, 1 << 40} {
				_, err := ts.client.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatInt(future, 10)})
				if !apierrors.IsTimeout(err) || !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
					t.Fatalf("watch from %d with the store at %d: %v, want Too large resource version", future, rv, err)
				}
			}
			// The present is fine.
			w, err := ts.client.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{ResourceVersion: cm.ResourceVersion})
			if err != nil {
				t.Fatal(err)
			}
			w.Stop()
		})
	}
}

func TestInformerListsWatchesAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, configMap("before", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(ts.client, 0)
	inf := factory.Core().V1().ConfigMaps().Informer()
	events := make(chan string, 100)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { events <- "add " + o.(*corev1.ConfigMap).Name },
		UpdateFunc: func(_, o any) { events <- "update " + o.(*corev1.ConfigMap).Name },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			events <- "delete " + o.(*corev1.ConfigMap).Name
		},
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer never synced")
	}
	expect := func(want string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case got := <-events:
				if got == want {
					return
				}
			case <-deadline:
				t.Fatalf("informer never saw %q", want)
			}
		}
	}
	expect("add before")
	cm, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, configMap("live", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expect("add live")
	cm.Data = map[string]string{"k": "v"}
	if _, err := ts.client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("update live")
	// Restart the server on the same data dir and port: the informer's
	// watch breaks, it re-watches, and sees what happens next.
	port := ts.srv.Addr().String()
	ts.stop()
	ts2 := restartOn(t, dir, port)
	if err := ts2.client.CoreV1().ConfigMaps("default").Delete(ctx, "live", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("delete live")
	if _, err := ts2.client.CoreV1().ConfigMaps("default").Create(ctx, configMap("after", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("add after")
}

func TestPagingAndSelectors(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	pods := ts.client.CoreV1().Pods("default")
	for i := 0; i < 25; i++ {
		p := pod(fmt.Sprintf("p%02d", i))
		p.Labels = map[string]string{"parity": []string{"even", "odd"}[i%2]}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	opts := metav1.ListOptions{Limit: 10}
	pages := 0
	for {
		list, err := pods.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
		// Writes between pages do not show up: a paged list is one snapshot.
		_, _ = pods.Create(ctx, pod(fmt.Sprintf("late%d", pages)), metav1.CreateOptions{})
	}
	if len(names) != 25 || pages != 3 {
		t.Fatalf("paged list: %d names over %d pages: %v", len(names), pages, names)
	}
	odd, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "parity=odd", Limit: 5})
	if err != nil || len(odd.Items) != 5 || odd.Continue == "" {
		t.Fatalf("label selector with limit: %d items, continue %q, %v", len(odd.Items), odd.Continue, err)
	}
	rest, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "parity=odd", Continue: odd.Continue})
	if err != nil || len(rest.Items) != 7 {
		t.Fatalf("second page of odd pods: %d, %v", len(rest.Items), err)
	}
	// Binding sets spec.nodeName, which field selectors can find.
	if err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p03"}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p03"}, Target: corev1.ObjectReference{Kind: "Node", Name: "n2"}}, metav1.CreateOptions{}); err == nil {
		t.Fatal("second binding of a bound pod succeeded")
	}
	onNode, err := ts.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"})
	if err != nil || len(onNode.Items) != 1 || onNode.Items[0].Name != "p03" {
		t.Fatalf("field selector spec.nodeName: %v %v", onNode, err)
	}
	if c := onNode.Items[0].Status.Conditions; len(c) != 1 || c[0].Type != corev1.PodScheduled || c[0].Status != corev1.ConditionTrue {
		t.Errorf("bound pod conditions: %+v", c)
	}
	// A bound pod is deleted gracefully: it stays, marked, until its node finishes it.
	if err := pods.Delete(ctx, "p03", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := pods.Get(ctx, "p03", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil || *p.DeletionGracePeriodSeconds != 30 {
		t.Fatalf("graceful delete: %+v %v", p, err)
	}
	if err := pods.Delete(ctx, "p03", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Get(ctx, "p03", metav1.GetOptions{}); err == nil {
		t.Fatal("pod still there after delete with grace 0")
	}
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "parity=even"}); err != nil {
		t.Fatal(err)
	}
	left, _ := pods.List(ctx, metav1.ListOptions{LabelSelector: "parity"})
	if len(left.Items) != 11 {
		t.Errorf("after deletecollection of even pods: %d left, want 11", len(left.Items))
	}
}

func TestFinalizersHoldDeletion(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	cm := configMap("held", nil)
	cm.Finalizers = []string{"example.com/hold"}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := cms.Get(ctx, "held", metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp == nil {
		t.Fatalf("object with a finalizer: %v %v", got, err)
	}
	if _, err := cms.Patch(ctx, "held", types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "held", metav1.GetOptions{}); err == nil {
		t.Fatal("object still there after its last finalizer was removed")
	}
}

func TestPatchTypes(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	deps := ts.client.AppsV1().Deployments("default")
	d := deployment("web", 1)
	d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, corev1.Container{Name: "side", Image: "busybox"})
	if _, err := deps.Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		typ   types.PatchType
		patch string
		check func(*appsv1.Deployment) bool
	}{
		{"json", types.JSONPatchType, `[{"op":"replace","path":"/spec/replicas","value":4}]`,
			func(d *appsv1.Deployment) bool { return *d.Spec.Replicas == 4 }},
		{"merge", types.MergePatchType, `{"metadata":{"labels":{"tier":"web"}}}`,
			func(d *appsv1.Deployment) bool { return d.Labels["tier"] == "web" }},
		// Strategic merge patches merge containers by name instead of replacing the list.
		{"strategic", types.StrategicMergePatchType, `{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox:1.37"}]}}}}`,
			func(d *appsv1.Deployment) bool {
				cs := d.Spec.Template.Spec.Containers
				return len(cs) == 2 && cs[0].Image == "busybox:1.37" && cs[1].Name == "side"
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := deps.Patch(ctx, "web", tc.typ, []byte(tc.patch), metav1.PatchOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(got) {
				t.Errorf("patch not applied: %+v", got.Spec)
			}
		})
	}
	// A patch carrying a stale resourceVersion is a precondition: 409.
	_, err := deps.Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"resourceVersion":"1"},"spec":{"replicas":2}}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "the object has been modified") {
		t.Fatalf("stale patch: %v", err)
	}
}

func TestTableResponses(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	if _, err := ts.client.CoreV1().Pods("default").Create(ctx, pod("tp"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	err := ts.client.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json").Do(ctx).Into(&table)
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, c.Name)
		}
	}
	if strings.Join(cols, ",") != "Name,Ready,Status,Restarts,Age" {
		t.Errorf("pod columns %v", cols)
	}
	if len(table.Rows) != 1 || table.Rows[0].Cells[0] != "tp" || table.Rows[0].Cells[1] != "0/1" || table.Rows[0].Cells[2] != "Pending" {
		t.Fatalf("rows %+v", table.Rows)
	}
	var meta metav1.PartialObjectMetadata
	if err := json.Unmarshal(table.Rows[0].Object.Raw, &meta); err != nil || meta.Name != "tp" || meta.Kind != "PartialObjectMetadata" {
		t.Errorf("row object: %s", table.Rows[0].Object.Raw)
	}
	// A review's answer has no metadata to make a Table of: a client that
	// takes only a Table gets 406, one that also takes JSON gets JSON, as
	// from Kubernetes (its conformance spec "should return a 406 for a
	// backend which does not implement metadata").
	sar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/", Verb: "get"}}}
	err = ts.client.AuthorizationV1().RESTClient().Post().Resource("selfsubjectaccessreviews").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Body(sar).Do(ctx).Into(&table)
	if status, ok := err.(apierrors.APIStatus); !ok || status.Status().Code != 406 {
		t.Errorf("a review asked for as a Table only: %v", err)
	}
	var answer authorizationv1.SelfSubjectAccessReview
	if err := ts.client.AuthorizationV1().RESTClient().Post().Resource("selfsubjectaccessreviews").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json").Body(sar).Do(ctx).Into(&answer); err != nil || !answer.Status.Allowed {
		t.Errorf("a review asked for as a Table or JSON: %v %+v", err, answer.Status)
	}
}

// TestEventsExpire: events go after the event TTL (an hour in orch
// server, two seconds here), as with kube-apiserver's --event-ttl.
func TestEventsExpire(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	now := time.Now()
	for name, last := range map[string]time.Time{"old": now.Add(-time.Hour), "fresh": now.Add(time.Hour)} {
		e := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p"},
			Reason:         "Test", Message: name, Type: corev1.EventTypeNormal,
			FirstTimestamp: metav1.NewTime(last), LastTimestamp: metav1.NewTime(last), Count: 1,
		}
		if _, err := ts.client.CoreV1().Events("default").Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := ts.client.CoreV1().Events("default").Get(ctx, "old", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an event an hour old was kept: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := ts.client.CoreV1().Events("default").Get(ctx, "fresh", metav1.GetOptions{}); err != nil {
		t.Fatalf("a fresh event went: %v", err)
	}
}
