// Package controllertest runs one loop against objects held in memory:
// its informers list and watch them, and its client's writes are recorded
// and applied, so that a test calls the loop's sync for one key and reads
// what it did, in milliseconds and without an API server. It speaks the
// Kubernetes REST API over an in-process HTTP server, so the loop under
// test uses its real client and informers; it checks nothing (no
// validation, admission or conflicts): the end-to-end tests on a real
// server (loopstest) stay the second tier.
package controllertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/apis"
	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
)

// Write is one change a loop asked for.
type Write struct {
	// Verb is create, update, patch or delete.
	Verb        string
	Resource    string // plural, with the group for named groups: "replicasets.apps"
	Namespace   string
	Name        string
	Subresource string
	// Object is the object as stored after the write (nil for delete).
	Object runtime.Object
}

func (w Write) String() string {
	s := w.Verb + " " + w.Resource
	if w.Subresource != "" {
		s += "/" + w.Subresource
	}
	return s + " " + w.Namespace + "/" + w.Name
}

// Fake is the in-memory API a loop runs against.
type Fake struct {
	// Client is the loop's client; Informers its informer factory;
	// Events records what the loop says.
	Client    *kube.Client
	Informers *kube.Informers
	Events    *Events

	t       testing.TB
	scheme  *runtime.Scheme
	codecs  serializer.CodecFactory
	kinds   map[schema.GroupVersionResource]schema.GroupVersionKind
	writing sync.Mutex
	mu      sync.Mutex
	rev     int64
	objects map[string]runtime.Object // gvr|namespace|name
	writes  []Write
	watches map[chan watch.Event]watchFilter
}

type watchFilter struct {
	gvr       schema.GroupVersionResource
	namespace string
}

// New serves objs until the test ends.
func New(t testing.TB, objs ...runtime.Object) *Fake {
	t.Helper()
	f := &Fake{t: t, scheme: apis.NewScheme(), objects: map[string]runtime.Object{}, kinds: map[schema.GroupVersionResource]schema.GroupVersionKind{},
		watches: map[chan watch.Event]watchFilter{}}
	f.codecs = serializer.NewCodecFactory(f.scheme)
	for gvk := range f.scheme.AllKnownTypes() {
		if strings.HasSuffix(gvk.Kind, "List") || gvk.Version == runtime.APIVersionInternal {
			continue
		}
		plural, _ := meta.UnsafeGuessKindToResource(gvk)
		if _, taken := f.kinds[plural]; !taken {
			f.kinds[plural] = gvk
		}
	}
	for _, obj := range objs {
		if err := f.store("create", obj, ""); err != nil {
			t.Fatal(err)
		}
	}
	f.writes = nil
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	client, err := kube.NewForConfig(&rest.Config{Host: srv.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	f.Client, f.Informers, f.Events = client, kube.NewInformers(client, 0), &Events{}
	return f
}

// Start runs the informers the loop registered until the test ends, and
// waits for them to hold every object.
func (f *Fake) Start() {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(func() {
		cancel()
		f.Informers.Shutdown()
	})
	f.Informers.Start(ctx)
	for name, ok := range f.Informers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			f.t.Fatalf("controllertest: the %s informer never synced", name)
		}
	}
}

// Writes returns the writes recorded since the last call.
func (f *Fake) Writes() []Write {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.writes
	f.writes = nil
	return out
}

// Get returns the stored object, or nil.
func (f *Fake) Get(gvr schema.GroupVersionResource, namespace, name string) runtime.Object {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objects[gvr.String()+"|"+namespace+"|"+name]
}

func (f *Fake) gvrOf(obj runtime.Object) (schema.GroupVersionResource, error) {
	gvks, _, err := f.scheme.ObjectKinds(obj)
	if err != nil {
		return schema.GroupVersionResource{}, err
	}
	plural, _ := meta.UnsafeGuessKindToResource(gvks[0])
	return plural, nil
}

// store writes obj (a create or update) and tells the watches.
func (f *Fake) store(verb string, obj runtime.Object, sub string) error {
	gvr, err := f.gvrOf(obj)
	if err != nil {
		return err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	key := gvr.String() + "|" + m.GetNamespace() + "|" + m.GetName()
	if m.GetName() == "" && m.GetGenerateName() != "" {
		m.SetName(m.GetGenerateName() + strconv.FormatInt(f.rev+1, 36))
		key = gvr.String() + "|" + m.GetNamespace() + "|" + m.GetName()
	}
	_, existed := f.objects[key]
	if m.GetUID() == "" {
		m.SetUID(types.UID(fmt.Sprintf("uid-%s-%d", m.GetName(), f.rev+1)))
	}
	if ts := m.GetCreationTimestamp(); ts.IsZero() {
		m.SetCreationTimestamp(metav1.NewTime(time.Now()))
	}
	f.rev++
	m.SetResourceVersion(strconv.FormatInt(f.rev, 10))
	gvk := f.kinds[gvr]
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	f.objects[key] = obj
	f.writes = append(f.writes, Write{Verb: verb, Resource: resourceName(gvr), Namespace: m.GetNamespace(), Name: m.GetName(), Subresource: sub, Object: obj.DeepCopyObject()})
	typ := watch.Modified
	if !existed {
		typ = watch.Added
	}
	f.notify(gvr, m.GetNamespace(), watch.Event{Type: typ, Object: obj.DeepCopyObject()})
	return nil
}

func resourceName(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Resource
	}
	return gvr.Resource + "." + gvr.Group
}

// notify sends ev to the watches of gvr; mu is held.
func (f *Fake) notify(gvr schema.GroupVersionResource, namespace string, ev watch.Event) {
	for ch, w := range f.watches {
		if w.gvr == gvr && (w.namespace == "" || w.namespace == namespace) {
			select {
			case ch <- ev:
			default:
				f.t.Errorf("controllertest: a watch of %s fell behind", gvr)
			}
		}
	}
}

// request is a parsed REST path.
type request struct {
	gvr                  schema.GroupVersionResource
	namespace, name, sub string
	watch                bool
	// sendInitialEvents: client-go's watch-list, a watch that starts
	// with the current objects and a bookmark marking their end.
	sendInitialEvents bool
}

func parse(r *http.Request) (request, error) {
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var q request
	switch {
	case len(segs) >= 3 && segs[0] == "api":
		q.gvr.Version, segs = segs[1], segs[2:]
	case len(segs) >= 4 && segs[0] == "apis":
		q.gvr.Group, q.gvr.Version, segs = segs[1], segs[2], segs[3:]
	default:
		return q, fmt.Errorf("not a resource path: %s", r.URL.Path)
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		q.namespace, segs = segs[1], segs[2:]
	}
	q.gvr.Resource = segs[0]
	if len(segs) > 1 {
		q.name = segs[1]
	}
	if len(segs) > 2 {
		q.sub = segs[2]
	}
	q.watch = r.URL.Query().Get("watch") == "true"
	q.sendInitialEvents = r.URL.Query().Get("sendInitialEvents") == "true"
	return q, nil
}

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	q, err := parse(r)
	if err != nil {
		f.fail(w, apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
		return
	}
	gvk, ok := f.kinds[q.gvr]
	if !ok {
		f.fail(w, apierrors.NewNotFound(q.gvr.GroupResource(), q.name))
		return
	}
	if r.Method != http.MethodGet {
		// One write at a time, each reading what it changes and storing
		// it at once, as the store's guaranteed update does.
		f.writing.Lock()
		defer f.writing.Unlock()
	}
	switch {
	case r.Method == http.MethodGet && q.watch:
		f.serveWatch(w, r, q)
	case r.Method == http.MethodGet && q.name == "":
		f.serveList(w, q, gvk)
	case r.Method == http.MethodGet:
		obj := f.Get(q.gvr, q.namespace, q.name)
		if obj == nil {
			f.fail(w, apierrors.NewNotFound(q.gvr.GroupResource(), q.name))
			return
		}
		f.reply(w, http.StatusOK, obj)
	case r.Method == http.MethodPost || r.Method == http.MethodPut:
		obj, err := f.decode(r, gvk)
		if err != nil {
			f.fail(w, apierrors.NewBadRequest(err.Error()))
			return
		}
		if m, err := meta.Accessor(obj); err == nil && m.GetNamespace() == "" {
			m.SetNamespace(q.namespace)
		}
		verb, code := "create", http.StatusCreated
		if r.Method == http.MethodPut {
			verb, code = "update", http.StatusOK
		}
		if q.sub == "binding" {
			f.bind(w, q, obj)
			return
		}
		if verb == "update" {
			// As the API server: no update makes an object, nor writes
			// over a newer one, nor changes the half of it that is not
			// its subresource's.
			if obj, err = f.keepOtherHalf(q, obj); err != nil {
				var status apierrors.APIStatus
				if errors.As(err, &status) {
					f.fail(w, &apierrors.StatusError{ErrStatus: status.Status()})
				} else {
					f.fail(w, apierrors.NewInternalError(err))
				}
				return
			}
		}
		if err := f.store(verb, obj, q.sub); err != nil {
			f.fail(w, apierrors.NewInternalError(err))
			return
		}
		f.reply(w, code, obj)
	case r.Method == http.MethodPatch:
		f.patch(w, r, q, gvk)
	case r.Method == http.MethodDelete:
		var opts metav1.DeleteOptions
		if body, err := io.ReadAll(r.Body); err == nil && len(body) > 0 {
			if err := json.Unmarshal(body, &opts); err != nil {
				f.fail(w, apierrors.NewBadRequest(err.Error()))
				return
			}
		}
		f.mu.Lock()
		key := q.gvr.String() + "|" + q.namespace + "|" + q.name
		obj, ok := f.objects[key]
		if ok && opts.Preconditions != nil && opts.Preconditions.UID != nil {
			if m, _ := meta.Accessor(obj); m.GetUID() != *opts.Preconditions.UID {
				f.mu.Unlock()
				f.fail(w, apierrors.NewConflict(q.gvr.GroupResource(), q.name, fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (%s)", *opts.Preconditions.UID, m.GetUID())))
				return
			}
		}
		if pod, isPod := obj.(*corev1.Pod); ok && isPod && pod.Spec.NodeName != "" && (opts.GracePeriodSeconds == nil || *opts.GracePeriodSeconds > 0) {
			// As the API server: a pod on a node is marked, and its
			// kubelet deletes it once it has stopped it.
			f.mu.Unlock()
			f.terminate(w, pod.DeepCopy(), opts.GracePeriodSeconds)
			return
		}
		if ok {
			delete(f.objects, key)
			f.rev++
			f.writes = append(f.writes, Write{Verb: "delete", Resource: resourceName(q.gvr), Namespace: q.namespace, Name: q.name})
			f.notify(q.gvr, q.namespace, watch.Event{Type: watch.Deleted, Object: obj})
		}
		f.mu.Unlock()
		if !ok {
			f.fail(w, apierrors.NewNotFound(q.gvr.GroupResource(), q.name))
			return
		}
		f.reply(w, http.StatusOK, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess})
	default:
		f.fail(w, apierrors.NewMethodNotSupported(q.gvr.GroupResource(), r.Method))
	}
}

// keepOtherHalf is an update as the API server takes it for kinds with a
// status: to the status subresource, only the status changes; to the
// object, everything but the status (and the deletion marks, which only
// a delete sets).
func (f *Fake) keepOtherHalf(q request, obj runtime.Object) (runtime.Object, error) {
	stored := f.Get(q.gvr, q.namespace, q.name)
	if stored == nil {
		return nil, apierrors.NewNotFound(q.gvr.GroupResource(), q.name)
	}
	if m, err := meta.Accessor(obj); err == nil && m.GetResourceVersion() != "" {
		if sm, _ := meta.Accessor(stored); sm.GetResourceVersion() != m.GetResourceVersion() {
			return nil, apierrors.NewConflict(q.gvr.GroupResource(), q.name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
		}
	}
	old, err := runtime.DefaultUnstructuredConverter.ToUnstructured(stored)
	if err != nil {
		return nil, err
	}
	if _, hasStatus := old["status"]; !hasStatus {
		return obj, nil
	}
	updated, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	if q.sub == "status" {
		old["status"] = updated["status"]
		updated = old // store gives it its new resourceVersion
	} else {
		updated["status"] = old["status"]
		newMeta, _ := updated["metadata"].(map[string]any)
		oldMeta, _ := old["metadata"].(map[string]any)
		for _, k := range []string{"deletionTimestamp", "deletionGracePeriodSeconds"} {
			if newMeta != nil {
				delete(newMeta, k)
				if v, ok := oldMeta[k]; ok {
					newMeta[k] = v
				}
			}
		}
	}
	out := obj.DeepCopyObject()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(updated, out); err != nil {
		return nil, err
	}
	return out, nil
}

// terminate marks a pod for its kubelet to stop and delete, as a
// graceful delete does.
func (f *Fake) terminate(w http.ResponseWriter, pod *corev1.Pod, grace *int64) {
	if pod.DeletionTimestamp == nil {
		seconds := int64(corev1.DefaultTerminationGracePeriodSeconds)
		switch {
		case grace != nil:
			seconds = *grace
		case pod.Spec.TerminationGracePeriodSeconds != nil:
			seconds = *pod.Spec.TerminationGracePeriodSeconds
		}
		now := metav1.Now()
		pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &seconds
		if err := f.store("delete", pod, ""); err != nil {
			f.fail(w, apierrors.NewInternalError(err))
			return
		}
	}
	f.reply(w, http.StatusOK, pod)
}

// bind records a pods/binding as the scheduler's write.
func (f *Fake) bind(w http.ResponseWriter, q request, body runtime.Object) {
	f.mu.Lock()
	f.writes = append(f.writes, Write{Verb: "create", Resource: resourceName(q.gvr), Namespace: q.namespace, Name: q.name, Subresource: "binding", Object: body})
	f.mu.Unlock()
	f.reply(w, http.StatusCreated, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess})
}

func (f *Fake) patch(w http.ResponseWriter, r *http.Request, q request, gvk schema.GroupVersionKind) {
	current := f.Get(q.gvr, q.namespace, q.name)
	if current == nil {
		f.fail(w, apierrors.NewNotFound(q.gvr.GroupResource(), q.name))
		return
	}
	patch, err := io.ReadAll(r.Body)
	if err != nil {
		f.fail(w, apierrors.NewBadRequest(err.Error()))
		return
	}
	orig, err := json.Marshal(current)
	if err != nil {
		f.fail(w, apierrors.NewInternalError(err))
		return
	}
	var patched []byte
	switch types.PatchType(r.Header.Get("Content-Type")) {
	case types.StrategicMergePatchType:
		patched, err = strategicpatch.StrategicMergePatch(orig, patch, current)
	case types.MergePatchType:
		patched, err = jsonpatch.MergePatch(orig, patch)
	default:
		err = fmt.Errorf("controllertest does not apply %s patches", r.Header.Get("Content-Type"))
	}
	if err != nil {
		f.fail(w, apierrors.NewBadRequest(err.Error()))
		return
	}
	obj, err := runtime.Decode(f.codecs.UniversalDeserializer(), patched)
	if err != nil {
		f.fail(w, apierrors.NewBadRequest(err.Error()))
		return
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	if err := f.store("patch", obj, q.sub); err != nil {
		f.fail(w, apierrors.NewInternalError(err))
		return
	}
	f.reply(w, http.StatusOK, obj)
}

func (f *Fake) decode(r *http.Request, gvk schema.GroupVersionKind) (runtime.Object, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	obj, _, err := f.codecs.UniversalDeserializer().Decode(body, &gvk, nil)
	return obj, err
}

func (f *Fake) serveList(w http.ResponseWriter, q request, gvk schema.GroupVersionKind) {
	list, err := f.scheme.New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err != nil {
		f.fail(w, apierrors.NewInternalError(err))
		return
	}
	f.mu.Lock()
	var items []runtime.Object
	var keys []string
	prefix := q.gvr.String() + "|"
	for k := range f.objects {
		if strings.HasPrefix(k, prefix) && (q.namespace == "" || strings.HasPrefix(k, prefix+q.namespace+"|")) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		items = append(items, f.objects[k].DeepCopyObject())
	}
	rev := f.rev
	f.mu.Unlock()
	if err := meta.SetList(list, items); err != nil {
		f.fail(w, apierrors.NewInternalError(err))
		return
	}
	lm, _ := meta.ListAccessor(list)
	lm.SetResourceVersion(strconv.FormatInt(rev, 10))
	f.reply(w, http.StatusOK, list)
}

// serveWatch streams the changes written from now on (an informer
// watches from the version its LIST returned, which no write has passed
// in the time between).
func (f *Fake) serveWatch(w http.ResponseWriter, r *http.Request, q request) {
	f.mu.Lock()
	// Room for every current object, and as many changes again.
	ch := make(chan watch.Event, 2*len(f.objects)+1024)
	f.watches[ch] = watchFilter{gvr: q.gvr, namespace: q.namespace}
	if q.sendInitialEvents {
		prefix := q.gvr.String() + "|"
		var keys []string
		for k := range f.objects {
			if strings.HasPrefix(k, prefix) && (q.namespace == "" || strings.HasPrefix(k, prefix+q.namespace+"|")) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			ch <- watch.Event{Type: watch.Added, Object: f.objects[k].DeepCopyObject()}
		}
		end, err := f.scheme.New(f.kinds[q.gvr])
		if err == nil {
			m, _ := meta.Accessor(end)
			m.SetResourceVersion(strconv.FormatInt(f.rev, 10))
			m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
			end.GetObjectKind().SetGroupVersionKind(f.kinds[q.gvr])
			ch <- watch.Event{Type: watch.Bookmark, Object: end}
		}
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.watches, ch)
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-ch:
			raw, err := json.Marshal(ev.Object)
			if err != nil {
				return
			}
			if err := enc.Encode(metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: raw}}); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
}

func (f *Fake) reply(w http.ResponseWriter, code int, obj runtime.Object) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(obj)
}

func (f *Fake) fail(w http.ResponseWriter, err *apierrors.StatusError) {
	st := err.Status()
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(&st)
}

// Events records the events a loop emits, as "Type Reason note".
type Events struct {
	mu   sync.Mutex
	list []string
}

// Eventf implements kube.EventRecorder.
func (e *Events) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, eventtype+" "+reason+" "+fmt.Sprintf(note, args...))
}

// List returns the events recorded so far.
func (e *Events) List() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

// Only keeps the writes of one verb and resource.
func Only(writes []Write, verb, resource string) []Write {
	var out []Write
	for _, w := range writes {
		if w.Verb == verb && w.Resource == resource {
			out = append(out, w)
		}
	}
	return out
}
