package pods

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/orch-dev/orch/internal/kube"
)

// TestRejectReportsOrRetries: a pod the node rejects is reported Failed;
// when the API server refuses the report (403: its node authorizer follows
// the pods' watch, and may not relate a pod just bound here to this node
// yet) the rejection is an error for the queue to try again, not a pod
// left Pending for good, as the conformance spec "Should recreate evicted
// statefulset" once found; a pod gone from the API (404) is let go.
func TestRejectReportsOrRetries(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ss-0", Namespace: "web", UID: "uid-2", ResourceVersion: "7"}}
	for _, tc := range []struct {
		code    int
		wantErr bool
	}{
		{http.StatusOK, false},
		{http.StatusForbidden, true},
		{http.StatusNotFound, false},
		{http.StatusConflict, true},
	} {
		var reported corev1.Pod
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPut || r.URL.Path != "/api/v1/namespaces/web/pods/ss-0/status" {
				http.Error(w, r.Method+" "+r.URL.Path, http.StatusTeapot)
				return
			}
			body, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(body, &reported)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.code)
			if tc.code == http.StatusOK {
				_, _ = w.Write(body)
				return
			}
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Code: int32(tc.code), Reason: metav1.StatusReason(strings.ReplaceAll(http.StatusText(tc.code), " ", "")), Message: "refused"})
		}))
		api, err := kube.NewForConfig(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		m := &Manager{api: api}
		err = m.reject(context.Background(), pod, "NodePorts", "node(s) didn't have free ports for the requested pod ports")
		srv.Close()
		if (err != nil) != tc.wantErr {
			t.Errorf("status answered %d: reject = %v, want an error: %v", tc.code, err, tc.wantErr)
		}
		if reported.Status.Phase != corev1.PodFailed || reported.Status.Reason != "NodePorts" ||
			reported.Status.Message != "Pod was rejected: node(s) didn't have free ports for the requested pod ports" {
			t.Errorf("status answered %d: reported %+v", tc.code, reported.Status)
		}
	}
}
