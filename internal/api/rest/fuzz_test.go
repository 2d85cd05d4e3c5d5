package rest

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources/builtin"
	"github.com/orch-dev/orch/internal/store/boltstore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fuzzHandler serves every resource over a real store, without the
// server's authentication or panic recovery: a panic fails the fuzz.
func fuzzHandler(f *testing.F) *Handler {
	all := builtin.Resources()
	st, err := boltstore.Open(f.TempDir(), boltstore.Options{VolatilePrefixes: registry.VolatilePrefixes(all), CompactInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = st.Close() })
	var storages []*registry.Storage
	for _, r := range all {
		storages = append(storages, registry.New(st, r))
	}
	catalog, err := registry.NewCatalog(storages...)
	if err != nil {
		f.Fatal(err)
	}
	return New(catalog, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// fuzzTargets are the requests the fuzzer's bodies are sent as.
var fuzzTargets = []struct{ method, path, contentType string }{
	{"POST", "/api/v1/namespaces/default/pods", "application/json"},
	{"POST", "/api/v1/namespaces/default/pods", "application/yaml"},
	{"POST", "/api/v1/namespaces/default/pods", "application/vnd.kubernetes.protobuf"},
	{"POST", "/api/v1/namespaces/default/pods?fieldValidation=Strict", "application/json"},
	{"PUT", "/api/v1/namespaces/default/pods/seed", "application/json"},
	{"PATCH", "/api/v1/namespaces/default/pods/seed", "application/strategic-merge-patch+json"},
	{"PATCH", "/api/v1/namespaces/default/pods/seed", "application/merge-patch+json"},
	{"PATCH", "/api/v1/namespaces/default/pods/seed", "application/json-patch+json"},
	{"POST", "/apis/apps/v1/namespaces/default/deployments", "application/json"},
	{"POST", "/api/v1/namespaces/default/services", "application/json"},
	{"POST", "/api/v1/namespaces", "application/yaml"},
	{"DELETE", "/api/v1/namespaces/default/configmaps/seed", "application/json"},
	{"PUT", "/apis/apps/v1/namespaces/default/deployments/seed/scale", "application/json"},
	{"POST", "/api/v1/namespaces/default/pods/seed/binding", "application/json"},
}

// FuzzDecodeValidate sends arbitrary bodies through decoding, defaulting,
// validation, patching and the registry. Whatever comes in, the answer is
// never a panic and never a 500: a bad body is the client's error, and
// every error is a metav1.Status.
func FuzzDecodeValidate(f *testing.F) {
	h := fuzzHandler(f)
	seed := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"seed"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`
	if code, body := fuzzRequest(h, "POST", "/api/v1/namespaces/default/pods", "application/json", []byte(seed)); code != http.StatusCreated {
		f.Fatalf("seed pod: %d %s", code, body)
	}
	var pb bytes.Buffer
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "pb"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if err := wire.protobuf.Encode(pod, &pb); err != nil {
		f.Fatal(err)
	}
	for i, body := range [][]byte{
		[]byte(seed), pb.Bytes(),
		[]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: y}\nspec: {containers: [{name: c, image: i}]}\n"),
		[]byte(`{"spec":{"containers":[{"name":"c","image":"other"}]}}`),
		[]byte(`[{"op":"replace","path":"/spec/containers/0/image","value":"x"}]`),
		[]byte(`{"metadata":{"labels":{"a":"b"}},"spec":{"$setElementOrder/containers":[{"name":"c"}]}}`),
		[]byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}}`),
		[]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"type":"NodePort","ports":[{"port":80,"nodePort":30001}]}}`),
		[]byte(`{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":-5,"preconditions":{"uid":"x"}}`),
		[]byte(`{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"seed"},"spec":{"replicas":-1}}`),
		[]byte(`{"apiVersion":"v1","kind":"Binding","metadata":{"name":"seed"},"target":{"kind":"Node","name":"n1"}}`),
		[]byte(`{"metadata":{"name":"a","namespace":"other"},"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1e999"}}}]}}`),
		[]byte("\x00\xff{"), nil,
	} {
		f.Add(uint8(i), body)
	}
	f.Fuzz(func(t *testing.T, target uint8, body []byte) {
		tg := fuzzTargets[int(target)%len(fuzzTargets)]
		code, resp := fuzzRequest(h, tg.method, tg.path, tg.contentType, body)
		if code >= 500 {
			t.Fatalf("%s %s (%s) with %q: %d %s", tg.method, tg.path, tg.contentType, body, code, resp)
		}
		if code >= 400 {
			var st metav1.Status
			if err := json.Unmarshal(resp, &st); err != nil || st.Kind != "Status" || int(st.Code) != code || st.Message == "" {
				t.Fatalf("%d answered with %q, not a Status", code, resp)
			}
		}
	})
}

func fuzzRequest(h *Handler, method, path, contentType string, body []byte) (int, []byte) {
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	r.Header.Set("Accept", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.Bytes()
}
