package rest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/resources"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// format is what the client accepts, from its Accept header.
type format struct {
	yaml bool
	// protobuf is Kubernetes' binary encoding, which its own components
	// (and client-go programs that ask for it) prefer.
	protobuf bool
	// table is the meta.k8s.io version of a Table response ("" for none).
	table string
	// partial asks for PartialObjectMetadata(List) instead of whole objects.
	partial bool
}

// negotiate picks the first media type in Accept that orch can produce
// for the request's resource: custom resources have no protobuf form (their
// partial metadata does), as in Kubernetes.
func (q *request) negotiate() (format, error) {
	// A review's answer has no object metadata: no Table or partial
	// metadata of it can be made (Kubernetes answers 406 when that is all
	// the client takes).
	return negotiate(q.r, !q.st.Resource.Custom, q.st.Resource.Review == nil)
}

// negotiate picks the first media type in Accept that orch can produce;
// metadata says whether the answer has object metadata to make a Table or
// PartialObjectMetadata of.
func negotiate(r *http.Request, wholeProtobuf, metadata bool) (format, error) {
	accept := r.Header.Get("Accept")
	if strings.TrimSpace(accept) == "" {
		return format{}, nil
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "application/json", "*/*", "application/*":
			switch params["as"] {
			case "":
				return format{}, nil
			case "Table":
				if metadata && params["g"] == "meta.k8s.io" && (params["v"] == "v1" || params["v"] == "v1beta1") {
					return format{table: params["v"]}, nil
				}
			case "PartialObjectMetadata", "PartialObjectMetadataList":
				if metadata && params["g"] == "meta.k8s.io" && (params["v"] == "v1" || params["v"] == "v1beta1") {
					return format{partial: true}, nil
				}
			}
		case "application/yaml":
			if params["as"] == "" {
				return format{yaml: true}, nil
			}
		case protobufType:
			switch params["as"] {
			case "":
				if wholeProtobuf {
					return format{protobuf: true}, nil
				}
			case "PartialObjectMetadata", "PartialObjectMetadataList":
				if metadata && params["g"] == "meta.k8s.io" && (params["v"] == "v1" || params["v"] == "v1beta1") {
					return format{protobuf: true, partial: true}, nil
				}
			}
		}
	}
	return format{}, &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusNotAcceptable, Reason: metav1.StatusReasonNotAcceptable,
		Message: fmt.Sprintf("only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;as=Table;v=v1;g=meta.k8s.io (asked for %q)", accept),
	}}
}

// respond writes obj in the negotiated form.
func (q *request) respond(code int, obj runtime.Object) error {
	f, err := q.negotiate()
	if err != nil {
		return err
	}
	if warn := q.st.Resource.Warn; warn != nil && (q.info.Verb == "create" || q.info.Verb == "update" || q.info.Verb == "patch") {
		for _, w := range warn(obj) {
			q.w.Header().Add("Warning", `299 - `+strconv.Quote(w))
		}
	}
	if _, isStatus := obj.(*metav1.Status); !isStatus {
		if obj, err = q.transform(obj, f); err != nil {
			return err
		}
	}
	return writeObject(q.w, q.r, code, obj, f)
}

// respondRaw writes obj, a subresource's own kind (Scale, Status), in the
// negotiated encoding, never as a table.
func (q *request) respondRaw(code int, obj runtime.Object) error {
	f, err := negotiate(q.r, true, true)
	if err != nil {
		return err
	}
	return writeObject(q.w, q.r, code, obj, format{yaml: f.yaml, protobuf: f.protobuf})
}

// transform turns obj into the Table or partial metadata the client asked for.
func (q *request) transform(obj runtime.Object, f format) (runtime.Object, error) {
	switch {
	case f.table != "":
		return q.table(obj, f.table)
	case f.partial:
		return partialMetadata(obj)
	}
	return obj, nil
}

// protobufType is the media type of Kubernetes' protobuf encoding.
const protobufType = "application/vnd.kubernetes.protobuf"

func writeObject(w http.ResponseWriter, r *http.Request, code int, obj any, f format) error {
	sendWarnings(w, r)
	var data []byte
	var err error
	if ro, ok := obj.(runtime.Object); ok && f.protobuf {
		var buf bytes.Buffer
		if err := wire.protobuf.Encode(ro, &buf); err != nil {
			return apierrors.NewInternalError(fmt.Errorf("encode %T as protobuf: %w", obj, err))
		}
		w.Header().Set("Content-Type", protobufType)
		w.WriteHeader(code)
		if r.Method != http.MethodHead {
			_, _ = w.Write(buf.Bytes())
		}
		return nil
	}
	asYAML := f.yaml
	if r.URL.Query().Get("pretty") == "true" {
		data, err = json.MarshalIndent(obj, "", "  ")
	} else {
		data, err = json.Marshal(obj)
	}
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	contentType := "application/json"
	if asYAML {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return apierrors.NewInternalError(err)
		}
		contentType = "application/yaml"
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
		if !asYAML {
			_, _ = w.Write([]byte("\n"))
		}
	}
	return nil
}

// writeError writes err as a metav1.Status with its HTTP code.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	WriteError(w, r, err)
	var se apierrors.APIStatus
	if !errors.As(err, &se) || se.Status().Code >= 500 {
		h.opts.Logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
}

// WriteError writes err as a metav1.Status; an error that is not already a
// Kubernetes status is an internal error.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	sendWarnings(w, r)
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		se = apierrors.NewInternalError(err)
	}
	st := se.Status()
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	if st.Status == "" {
		st.Status = metav1.StatusFailure
	}
	if st.Code == 0 {
		st.Code = http.StatusInternalServerError
	}
	if st.Code == http.StatusTooManyRequests || st.Code == http.StatusGatewayTimeout && st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(st.Details.RetryAfterSeconds))
	}
	_ = writeObject(w, r, int(st.Code), &st, format{})
}

// table builds the Table `kubectl get` prints for an object or a list.
func (q *request) table(obj runtime.Object, version string) (*metav1.Table, error) {
	var opts metav1.TableOptions
	if err := q.h.params.DecodeParameters(q.r.URL.Query(), metav1.SchemeGroupVersion, &opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return buildTable(q.st.Resource, obj, version, opts)
}

func buildTable(r *resources.Resource, obj runtime.Object, version string, opts metav1.TableOptions) (*metav1.Table, error) {
	t := &metav1.Table{TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/" + version}}
	if !opts.NoHeaders {
		t.ColumnDefinitions = r.Columns
		if t.ColumnDefinitions == nil {
			t.ColumnDefinitions = resources.DefaultColumns
		}
	}
	items := []runtime.Object{obj}
	if meta.IsListType(obj) {
		var err error
		if items, err = meta.ExtractList(obj); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if lm, err := meta.ListAccessor(obj); err == nil {
			t.ResourceVersion, t.Continue, t.RemainingItemCount = lm.GetResourceVersion(), lm.GetContinue(), lm.GetRemainingItemCount()
		}
	} else if m, err := meta.Accessor(obj); err == nil {
		t.ResourceVersion = m.GetResourceVersion()
	}
	row := r.Row
	if row == nil {
		row = resources.DefaultRow
	}
	t.Rows = make([]metav1.TableRow, 0, len(items))
	for _, item := range items {
		tr := metav1.TableRow{Cells: row(item)}
		if r.Columns == nil {
			tr.Cells = resources.DefaultRow(item)
		}
		switch opts.IncludeObject {
		case metav1.IncludeNone:
		case metav1.IncludeObject:
			raw, err := json.Marshal(item)
			if err != nil {
				return nil, apierrors.NewInternalError(err)
			}
			tr.Object.Raw = raw
		default:
			pm, err := partialMetadata(item)
			if err != nil {
				return nil, err
			}
			raw, err := json.Marshal(pm)
			if err != nil {
				return nil, apierrors.NewInternalError(err)
			}
			tr.Object.Raw = raw
		}
		t.Rows = append(t.Rows, tr)
	}
	return t, nil
}

// partialMetadata reduces an object or list to its metadata, as
// PartialObjectMetadata(List) for metadata-only clients.
func partialMetadata(obj runtime.Object) (runtime.Object, error) {
	if meta.IsListType(obj) {
		items, err := meta.ExtractList(obj)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		out := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"}}
		if lm, err := meta.ListAccessor(obj); err == nil {
			out.ResourceVersion, out.Continue = lm.GetResourceVersion(), lm.GetContinue()
		}
		for _, item := range items {
			pm, err := partialMetadata(item)
			if err != nil {
				return nil, err
			}
			out.Items = append(out.Items, *pm.(*metav1.PartialObjectMetadata))
		}
		return out, nil
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		// A custom resource's metadata, as the typed ObjectMeta.
		var om metav1.ObjectMeta
		if m, found := u.Object["metadata"].(map[string]any); found {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &om); err != nil {
				return nil, apierrors.NewInternalError(fmt.Errorf("the metadata of %s: %w", u.GetName(), err))
			}
		}
		return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"}, ObjectMeta: om}, nil
	}
	acc, ok := obj.(metav1.ObjectMetaAccessor)
	if !ok {
		return nil, apierrors.NewInternalError(fmt.Errorf("%T has no ObjectMeta", obj))
	}
	om, ok := acc.GetObjectMeta().(*metav1.ObjectMeta)
	if !ok {
		return nil, apierrors.NewInternalError(fmt.Errorf("%T has no ObjectMeta", obj))
	}
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"}, ObjectMeta: *om}, nil
}

// sendWarnings adds what admission had to tell the client (webhooks'
// warnings) as Warning headers, before the answer is written.
func sendWarnings(w http.ResponseWriter, r *http.Request) {
	ws := admission.WarningsFrom(r.Context())
	if ws == nil {
		return
	}
	for _, msg := range ws.Take() {
		w.Header().Add("Warning", `299 - `+strconv.Quote(truncateWarning(msg)))
	}
}

// maxWarning is Kubernetes' cap on one warning's length.
const maxWarning = 4096

func truncateWarning(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxWarning {
		s = s[:maxWarning]
	}
	return s
}
