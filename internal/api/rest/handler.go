// Package rest serves the Kubernetes REST API over the registry: routing by
// group, version, namespace, resource, name and subresource; decoding and
// checking request bodies; the verbs get, list, watch, create, update,
// patch, delete and deletecollection; content negotiation (JSON, YAML and
// the Table form `kubectl get` asks for); discovery; and metav1.Status for
// every error.
package rest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/apply"
	"github.com/orch-dev/orch/internal/api/memo"
	"github.com/orch-dev/orch/internal/api/resources"

	"github.com/orch-dev/orch/internal/api/registry"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/version"
	"sigs.k8s.io/yaml"
)

// MaxBodyBytes is Kubernetes' limit on a request body (3 MiB).
const MaxBodyBytes = 3 << 20

// BodyReadTimeout is how long a request body may take to arrive.
const BodyReadTimeout = time.Minute

// Options tune a Handler.
type Options struct {
	// BookmarkInterval is how often a watch that allows bookmarks gets one.
	BookmarkInterval time.Duration
	// MinWatchTimeout: a watch without timeoutSeconds ends after a random
	// time between it and twice it, as in Kubernetes, so clients rebalance.
	MinWatchTimeout time.Duration
	Version         version.Info
	Logger          *slog.Logger
	// Kubelets serves pods/log from the pods' nodes.
	Kubelets Kubelets
	// DialPod connects to pods for pods/proxy and services/proxy (nil:
	// directly).
	DialPod func(ctx context.Context, network, addr string) (net.Conn, error)
	// Aggregated, when set, gives the group/versions other servers serve
	// behind this one (API aggregation), which discovery lists with its
	// own; one of them replaces a group/version of its own.
	Aggregated func() []AggregatedGroupVersion
}

// AggregatedGroupVersion is a group/version another server serves
// behind this one.
type AggregatedGroupVersion struct {
	schema.GroupVersion
	// Resources is what that server said it serves (nil: not known yet).
	Resources []metav1.APIResource
	// Available: its last check passed; aggregated discovery marks the
	// others stale.
	Available bool
}

// Handler serves /api and /apis.
type Handler struct {
	scheme *runtime.Scheme
	params runtime.ParameterCodec
	ser    serializers
	// encodings lets the watchers of one change encode it once.
	encodings *memo.Ring[encodingKey, []byte]
	catalog   *registry.Catalog
	// discovery is built from one catalog snapshot and rebuilt when the
	// catalog changes.
	discovery atomic.Pointer[discoveryView]
	opts      Options
	// proxyTransport reaches pods for pods/proxy and services/proxy.
	proxyTransport *http.Transport
}

// New serves the resources of the catalog, as it is at each request.
func New(catalog *registry.Catalog, opts Options) *Handler {
	if opts.BookmarkInterval <= 0 {
		opts.BookmarkInterval = time.Minute
	}
	if opts.MinWatchTimeout <= 0 {
		opts.MinWatchTimeout = 30 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	limitPatchCopies()
	return &Handler{scheme: wire.scheme, params: runtime.NewParameterCodec(wire.scheme), ser: wire, encodings: newSharedEncodings(1024), catalog: catalog, opts: opts,
		proxyTransport: newProxyTransport(opts.DialPod)}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	info := ParseRequest(r)
	r = r.WithContext(admission.WithWarnings(r.Context(), &admission.Warnings{}))
	served := h.catalog.Load()
	if !info.IsResource {
		h.serveDiscovery(w, r, info, served)
		return
	}
	st := served.Storage(schema.GroupVersionResource{Group: info.Group, Version: info.Version, Resource: info.Resource})
	if st == nil {
		h.writeError(w, r, notServed())
		return
	}
	if st.Resource.Namespaced != (info.Namespace != "") && info.Name != "" && info.Resource != "namespaces" {
		h.writeError(w, r, apierrors.NewNotFound(schema.GroupResource{Group: info.Group, Resource: info.Resource}, info.Name))
		return
	}
	var sub *resources.Subresource
	if info.Subresource != "" {
		if sub = st.Resource.Subresource(info.Subresource); sub == nil {
			h.writeError(w, r, apierrors.NewNotFound(schema.GroupResource{Group: info.Group, Resource: info.Resource + "/" + info.Subresource}, info.Name))
			return
		}
	}
	namespace := info.Namespace
	if !st.Resource.Namespaced {
		namespace = ""
	}
	req := &request{h: h, w: w, r: r, st: st, served: served, info: info, namespace: namespace}
	serve := resources.ServeStatus
	if sub != nil {
		serve = sub.Serve
	}
	if info.SubPath != "" && serve != resources.ServeNodeProxy && serve != resources.ServeProxy {
		h.writeError(w, r, apierrors.NewNotFound(schema.GroupResource{Group: info.Group, Resource: info.Resource + "/" + info.Subresource}, info.Name))
		return
	}
	// A log's, a stream's or a proxied query is its own (command,
	// container, follow...).
	if serve != resources.ServeStream && serve != resources.ServeNodeProxy && serve != resources.ServeProxy {
		if err := req.checkOptions(); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	var err error
	switch serve {
	case resources.ServeScale:
		err = req.scale(sub.Scale)
	case resources.ServeLog:
		err = req.podLog()
	case resources.ServeStream:
		err = req.podStream()
	case resources.ServeNodeProxy:
		err = req.nodeProxy()
	case resources.ServeProxy:
		err = req.proxy()
	case resources.ServeAction:
		err = req.action(sub)
	case resources.ServeAnswer:
		err = req.answer(sub)
	default:
		err = req.serve()
	}
	if err != nil {
		h.writeError(w, r, err)
	}
}

// request is one REST call in flight.
type request struct {
	h         *Handler
	w         http.ResponseWriter
	r         *http.Request
	st        *registry.Storage
	served    *registry.Served
	info      RequestInfo
	namespace string
}

func (q *request) ctx() context.Context { return q.r.Context() }

func (q *request) serve() error {
	if q.st.Resource.Review != nil {
		return q.review()
	}
	if q.st.Resource.Live != nil {
		return q.live()
	}
	switch q.info.Verb {
	case "get":
		obj, err := q.st.Get(q.ctx(), q.namespace, q.info.Name)
		if err != nil {
			return err
		}
		return q.respond(http.StatusOK, obj)
	case "list":
		opts, err := q.listOptions()
		if err != nil {
			return err
		}
		list, err := q.st.List(q.ctx(), q.namespace, opts)
		if err != nil {
			return err
		}
		return q.respond(http.StatusOK, list)
	case "watch":
		return q.watch()
	case "create":
		if q.info.Name != "" {
			return apierrors.NewMethodNotSupported(q.st.Resource.GroupVersionResource().GroupResource(), "create")
		}
		return q.create()
	case "update":
		return q.update()
	case "patch":
		return q.patch()
	case "delete":
		return q.delete()
	case "deletecollection":
		return q.deleteCollection()
	}
	return apierrors.NewMethodNotSupported(q.st.Resource.GroupVersionResource().GroupResource(), q.info.Verb)
}

// live serves get and list of a computed resource.
func (q *request) live() error {
	var obj runtime.Object
	var err error
	switch q.info.Verb {
	case "get":
		obj, err = q.st.Resource.Live.Get(q.ctx(), q.namespace, q.info.Name)
	case "list":
		var opts *metav1.ListOptions
		if opts, err = q.listOptions(); err == nil {
			obj, err = q.st.Resource.Live.List(q.ctx(), q.namespace, opts)
		}
	default:
		return apierrors.NewMethodNotSupported(q.st.Resource.GroupResource(), q.info.Verb)
	}
	if err != nil {
		return err
	}
	return q.respond(http.StatusOK, obj)
}

func (q *request) listOptions() (*metav1.ListOptions, error) {
	var opts metav1.ListOptions
	if err := q.h.params.DecodeParameters(q.r.URL.Query(), metav1.SchemeGroupVersion, &opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return &opts, nil
}

func (q *request) dryRun() bool {
	for _, v := range q.r.URL.Query()["dryRun"] {
		if v == metav1.DryRunAll {
			return true
		}
	}
	return false
}

// writeOptions are the options of a create, update or patch: dry run, and
// the field manager it is recorded under in managedFields.
func (q *request) writeOptions() registry.WriteOptions {
	return registry.WriteOptions{DryRun: q.dryRun(), FieldManager: apply.ManagerName(q.r.URL.Query().Get("fieldManager"), q.r.UserAgent())}
}

func (q *request) create() error {
	obj, err := q.decodeBody(q.st.Resource.GroupVersionKind, q.st.Resource.New())
	if err != nil {
		return err
	}
	if err := q.checkNamespace(obj, ""); err != nil {
		return err
	}
	out, err := q.st.Create(q.ctx(), obj, q.writeOptions())
	if err != nil {
		return err
	}
	return q.respond(http.StatusCreated, out)
}

// review answers a create of a resource that is a question (an access
// review): validated as a create is, answered, stored nowhere.
func (q *request) review() error {
	r := q.st.Resource
	if q.info.Verb != "create" || q.info.Name != "" {
		return apierrors.NewMethodNotSupported(r.GroupResource(), q.info.Verb)
	}
	if _, err := q.negotiate(); err != nil {
		return err // what the client takes is known before the question is asked
	}
	obj, err := q.decodeBody(r.GroupVersionKind, r.New())
	if err != nil {
		return err
	}
	if err := q.checkNamespace(obj, ""); err != nil {
		return err
	}
	if r.Validate != nil {
		if errs := r.Validate(obj); len(errs) > 0 {
			return apierrors.NewInvalid(r.GroupKind(), "", errs)
		}
	}
	out, err := r.Review(q.ctx(), obj)
	if err != nil {
		return err
	}
	return q.respond(http.StatusCreated, out)
}

// checkNamespace fills in the URL's namespace, rejecting a body that names
// another one, and checks the body's name against the URL's.
func (q *request) checkNamespace(obj runtime.Object, urlName string) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	if q.st.Resource.Namespaced {
		switch m.GetNamespace() {
		case "":
			m.SetNamespace(q.namespace)
		case q.namespace:
		default:
			return apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
		}
	} else if m.GetNamespace() != "" {
		m.SetNamespace("")
	}
	if urlName != "" && m.GetName() != urlName {
		if m.GetName() == "" {
			m.SetName(urlName)
		} else {
			return apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), urlName))
		}
	}
	return nil
}

func (q *request) update() error {
	obj, err := q.decodeBody(q.st.Resource.GroupVersionKind, q.st.Resource.New())
	if err != nil {
		return err
	}
	if err := q.checkNamespace(obj, q.info.Name); err != nil {
		return err
	}
	out, created, err := q.st.Update(q.ctx(), q.namespace, q.info.Name, func(context.Context, runtime.Object) (runtime.Object, error) {
		return obj.DeepCopyObject(), nil
	}, registry.UpdateOptions{WriteOptions: q.writeOptions(), Subresource: q.info.Subresource})
	if err != nil {
		return err
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	return q.respond(code, out)
}

func (q *request) deleteOptions() (*metav1.DeleteOptions, error) {
	opts := &metav1.DeleteOptions{}
	body, err := q.readBody()
	if err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		var dec runtime.Decoder = q.h.ser.json
		switch ct, _, _ := strings.Cut(q.r.Header.Get("Content-Type"), ";"); strings.TrimSpace(ct) {
		case "application/vnd.kubernetes.protobuf":
			dec = q.h.ser.protobuf
		case "application/yaml":
			dec = q.h.ser.yaml
		}
		gvk := metav1.SchemeGroupVersion.WithKind("DeleteOptions")
		if _, _, err := dec.Decode(body, &gvk, opts); err != nil {
			// Kubernetes takes DeleteOptions in every group's version
			// (a custom resource's too: controller-runtime sends them so).
			if !runtime.IsNotRegisteredError(err) || dec == q.h.ser.protobuf {
				return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid delete options: %v", err))
			}
			*opts = metav1.DeleteOptions{}
			if err := yaml.UnmarshalStrict(body, opts); err != nil || opts.Kind != "DeleteOptions" {
				return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid delete options: %v", err))
			}
			opts.TypeMeta = metav1.TypeMeta{}
		}
	}
	if err := q.h.params.DecodeParameters(q.r.URL.Query(), metav1.SchemeGroupVersion, opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if opts.GracePeriodSeconds != nil && *opts.GracePeriodSeconds < 0 {
		zero := int64(0)
		opts.GracePeriodSeconds = &zero
	}
	if err := invalidOptions("DeleteOptions", metav1validation.ValidateDeleteOptions(opts)); err != nil {
		return nil, err
	}
	return opts, nil
}

func (q *request) delete() error {
	opts, err := q.deleteOptions()
	if err != nil {
		return err
	}
	dry := q.dryRun() || len(opts.DryRun) > 0
	out, err := q.st.Delete(q.ctx(), q.namespace, q.info.Name, opts, registry.WriteOptions{DryRun: dry})
	if err != nil {
		return err
	}
	return q.respond(http.StatusOK, out)
}

func (q *request) deleteCollection() error {
	opts, err := q.deleteOptions()
	if err != nil {
		return err
	}
	listOpts, err := q.listOptions()
	if err != nil {
		return err
	}
	list, err := q.st.List(q.ctx(), q.namespace, listOpts)
	if err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	dry := q.dryRun() || len(opts.DryRun) > 0
	for _, item := range items {
		m, _ := meta.Accessor(item)
		if _, err := q.st.Delete(q.ctx(), m.GetNamespace(), m.GetName(), opts, registry.WriteOptions{DryRun: dry}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return q.respond(http.StatusOK, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess,
		Details: &metav1.StatusDetails{Group: q.info.Group, Kind: q.info.Resource}})
}

func (q *request) readBody() ([]byte, error) {
	if q.r.Body == nil {
		return nil, nil
	}
	// A client that trickles its body gets a minute for it, then the
	// connection's read fails (the loopback transport has no deadline).
	rc := http.NewResponseController(q.w)
	if rc.SetReadDeadline(time.Now().Add(BodyReadTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	body, err := io.ReadAll(http.MaxBytesReader(q.w, q.r.Body, MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d", MaxBodyBytes))
	}
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("read request body: %v", err))
	}
	return body, nil
}

// decodeBody reads the request body as want, honouring fieldValidation:
// Strict rejects unknown or duplicate fields with 400, Warn (the default)
// returns them as Warning headers, Ignore drops them.
func (q *request) decodeBody(want schema.GroupVersionKind, into runtime.Object) (runtime.Object, error) {
	body, err := q.readBody()
	if err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, apierrors.NewBadRequest("the request body is empty: send a " + want.Kind + " object")
	}
	return q.decode(body, q.r.Header.Get("Content-Type"), want, into)
}

func (q *request) decode(body []byte, contentType string, want schema.GroupVersionKind, into runtime.Object) (runtime.Object, error) {
	mediaType, _, _ := strings.Cut(contentType, ";")
	validation := q.r.URL.Query().Get("fieldValidation") // checked by checkOptions
	strict := validation != metav1.FieldValidationIgnore
	var dec runtime.Decoder
	switch strings.TrimSpace(strings.ToLower(mediaType)) {
	case "", "application/json", "*/*":
		dec = pick(strict, q.h.ser.strictJSON, q.h.ser.json)
	case "application/yaml", "application/x-yaml", "text/yaml":
		dec = pick(strict, q.h.ser.strictYAML, q.h.ser.yaml)
	case "application/vnd.kubernetes.protobuf":
		if _, custom := into.(runtime.Unstructured); custom {
			// Custom resources have no protobuf form, as in Kubernetes.
			return nil, &apierrors.StatusError{ErrStatus: metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusUnsupportedMediaType, Reason: metav1.StatusReasonUnsupportedMediaType,
				Message: fmt.Sprintf("the body of the request was in an unknown format (%s) - accepted media types include: application/json, application/yaml", mediaType),
			}}
		}
		// kubectl and client-go send built-in types as protobuf, which has no
		// unknown fields to validate.
		dec = q.h.ser.protobuf
	default:
		return nil, unsupportedMediaType(mediaType)
	}
	obj, gvk, err := dec.Decode(body, &want, into)
	if err != nil && runtime.IsStrictDecodingError(err) && obj != nil {
		if validation == metav1.FieldValidationStrict {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if strictErr, ok := runtime.AsStrictDecodingError(err); ok {
			for _, e := range strictErr.Errors() {
				q.w.Header().Add("Warning", `299 - `+strconv.Quote(e.Error()))
			}
		}
		err = nil
	}
	if runtime.IsNotRegisteredError(err) {
		if js, yerr := yaml.YAMLToJSON(body); yerr == nil {
			if got, ierr := json.DefaultMetaFactory.Interpret(js); ierr == nil && got.GroupVersion() != want.GroupVersion() {
				return nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", got.GroupVersion(), want.GroupVersion()))
			}
		}
	}
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the body of the request could not be decoded as %s: %v", want.Kind, err))
	}
	if gvk.GroupVersion() != want.GroupVersion() {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", gvk.GroupVersion(), want.GroupVersion()))
	}
	if gvk.Kind != want.Kind {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the kind in the data (%s) does not match the expected kind (%s)", gvk.Kind, want.Kind))
	}
	if r := q.st.Resource; r.Normalize != nil && want == r.GroupVersionKind {
		// Fields a custom resource's schema does not know are dropped,
		// and reported as fieldValidation asks (Kubernetes' words).
		unknown := r.Normalize(obj)
		switch validation {
		case metav1.FieldValidationIgnore:
		case metav1.FieldValidationStrict:
			if len(unknown) > 0 {
				msgs := make([]string, len(unknown))
				for i, f := range unknown {
					msgs[i] = fmt.Sprintf("unknown field %q", f)
				}
				return nil, apierrors.NewBadRequest("strict decoding error: " + strings.Join(msgs, ", "))
			}
		default:
			for _, f := range unknown {
				q.w.Header().Add("Warning", `299 - `+strconv.Quote(fmt.Sprintf("unknown field %q", f)))
			}
		}
	}
	return obj, nil
}

func pick[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}

func unsupportedMediaType(mediaType string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusUnsupportedMediaType, Reason: metav1.StatusReasonUnsupportedMediaType,
		Message: fmt.Sprintf("the body of the request was in an unknown format (%s) - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf", mediaType),
	}}
}

// watchTimeout is timeoutSeconds, or a random time in [min, 2*min).
func (q *request) watchTimeout(opts *metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		return time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	min := q.h.opts.MinWatchTimeout
	return min + time.Duration(rand.Int64N(int64(min)))
}

// notServed is Kubernetes' answer for a path it does not serve: a group,
// version or resource it does not have.
func notServed() error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound,
		Reason: metav1.StatusReasonNotFound, Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}}
}
