package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

func restHTTPClient(ts *testServer) (*http.Client, error) { return rest.HTTPClientFor(ts.config) }

func readAll(resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestBadInput(t *testing.T) {
	ts := startServer(t, "")
	const cms = "/api/v1/namespaces/default/configmaps"
	big := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"a":"` + strings.Repeat("x", 3<<20) + `"}}`
	// Under the body limit, over what Kubernetes stores.
	mib := strings.Repeat("x", 1100<<10)
	bigConfigMap := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bigcm"},"data":{"a":"` + mib + `"}}`
	bigSecret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"bigsecret"},"stringData":{"a":"` + mib + `"}}`
	var images []string
	for i := range 20 {
		images = append(images, fmt.Sprintf(`{"names":["registry.local/image-%d:%s"]}`, i, strings.Repeat("v", 100<<10)))
	}
	bigNode := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"big"},"status":{"images":[` + strings.Join(images, ",") + `]}}`
	// Each copy puts the whole data map inside itself: 40 of them in a
	// 2 KB patch would make 2^40 copies.
	var copies []string
	for i := range 40 {
		copies = append(copies, fmt.Sprintf(`{"op":"copy","from":"/data","path":"/data/k%d"}`, i))
	}
	copyBomb := "[" + strings.Join(copies, ",") + "]"
	if code, body, _ := ts.rawRequest(t, "POST", cms, "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"target"},"data":{"a":"x"}}`); code != 201 {
		t.Fatalf("create target: %d %s", code, body)
	}
	for _, tc := range []struct {
		name, method, path, contentType, body string
		code                                  int
		message                               string
	}{
		{"malformed JSON", "POST", cms, "application/json", `{"apiVersion":"v1",`, 400, "could not be decoded"},
		{"malformed YAML", "POST", cms, "application/yaml", "apiVersion: v1\nkind: [", 400, "could not be decoded"},
		{"wrong kind", "POST", cms, "application/json", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}`, 400, "does not match the expected kind"},
		{"wrong apiVersion", "POST", cms, "application/json", `{"apiVersion":"apps/v1","kind":"ConfigMap","metadata":{"name":"x"}}`, 400, "does not match the expected API version"},
		{"namespace differs from URL", "POST", cms, "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"kube-system"}}`, 400, "does not match the namespace"},
		{"name differs from URL", "PUT", cms + "/a", "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b"}}`, 400, "does not match the name"},
		{"body over 3 MiB", "POST", cms, "application/json", big, 413, "limit is"},
		{"empty body", "POST", cms, "application/json", "", 400, "empty"},
		{"ConfigMap over 1 MiB", "POST", cms, "application/json", bigConfigMap, 422, "Too long: may not be more than 1048576 bytes"},
		{"Secret over 1 MiB", "POST", "/api/v1/namespaces/default/secrets", "application/json", bigSecret, 422, "data: Too long: may not be more than 1048576"},
		{"registry credential that does not parse", "POST", "/api/v1/namespaces/default/secrets", "application/json",
			`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"regcred"},"type":"kubernetes.io/dockerconfigjson","stringData":{".dockerconfigjson":"{not json"}}`,
			422, `data[.dockerconfigjson]: Invalid value: "<secret contents redacted>"`},
		{"dockercfg without its key", "POST", "/api/v1/namespaces/default/secrets", "application/json",
			`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"oldcred"},"type":"kubernetes.io/dockercfg","data":{}}`, 422, "data[.dockercfg]: Required value"},
		{"object over 1.5 MiB", "POST", "/api/v1/nodes", "application/json", bigNode, 413, "more than the limit of 1572864"},
		{"JSON patch of copies", "PATCH", cms + "/target", "application/json-patch+json", copyBomb, 413, "copy"},
		{"unknown media type", "POST", cms, "text/plain", "hello", 415, "unknown format"},
		{"unknown field, strict", "POST", cms + "?fieldValidation=Strict", "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"dataa":{}}`, 400, `unknown field "dataa"`},
		{"bad label selector", "GET", cms + "?labelSelector=a%20in%20(", "", "", 400, "unable to parse"},
		{"unsupported field selector", "GET", cms + "?fieldSelector=spec.foo%3Dbar", "", "", 400, "field label not supported"},
		{"unknown resource", "GET", "/api/v1/namespaces/default/widgets", "", "", 404, "the server could not find the requested resource"},
		{"unknown group version", "GET", "/apis/widgets.example.com/v1", "", "", 404, "the server could not find the requested resource"},
		{"unknown group", "GET", "/apis/widgets.example.com", "", "", 404, "the server could not find the requested resource"},
		{"bad resourceVersion", "GET", cms + "?resourceVersion=abc", "", "", 400, "invalid resource version"},
		{"JSON patch that fails", "PATCH", "/api/v1/namespaces/default/services/kubernetes", "application/json-patch+json", `[{"op":"test","path":"/metadata/name","value":"other"}]`, 422, "could not be applied"},
		// Options Kubernetes validates before anything is done, answering
		// 422 with the options' kind (ValidateCreateOptions and friends),
		// or 400 for a parameter that does not parse.
		{"dryRun not All, create", "POST", cms + "?dryRun=Bogus", "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"dry"}}`, 422, `CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value`},
		{"dryRun not All, update", "PUT", "/api/v1/namespaces/default/services/kubernetes?dryRun=Bogus", "application/json", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"kubernetes"}}`, 422, "UpdateOptions.meta.k8s.io"},
		{"dryRun not All, patch", "PATCH", "/api/v1/namespaces/default/services/kubernetes?dryRun=Bogus", "application/merge-patch+json", `{"metadata":{"labels":{"a":"b"}}}`, 422, "PatchOptions.meta.k8s.io"},
		{"dryRun not All, delete", "DELETE", "/api/v1/namespaces/default/services/kubernetes?dryRun=Bogus", "", "", 422, "DeleteOptions.meta.k8s.io"},
		{"dryRun not All, delete collection", "DELETE", cms + "?dryRun=Bogus", "", "", 422, "DeleteOptions.meta.k8s.io"},
		{"unknown fieldValidation", "POST", cms + "?fieldValidation=Bogus", "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fv"}}`, 422, "fieldValidation: Unsupported value"},
		{"limit not a number", "GET", cms + "?limit=abc", "", "", 400, "abc"},
		{"timeoutSeconds not a number", "GET", cms + "?watch=1&timeoutSeconds=abc", "", "", 400, "abc"},
		{"resourceVersionMatch without resourceVersion", "GET", cms + "?resourceVersionMatch=NotOlderThan", "", "", 422, "resourceVersionMatch is forbidden unless resourceVersion is provided"},
		{"resourceVersionMatch with continue", "GET", cms + "?resourceVersionMatch=Exact&resourceVersion=1&continue=abc", "", "", 422, "resourceVersionMatch is forbidden when continue is provided"},
		{"resourceVersionMatch Exact at 0", "GET", cms + "?resourceVersionMatch=Exact&resourceVersion=0", "", "", 422, `resourceVersionMatch "exact" is forbidden for resourceVersion "0"`},
		{"unknown resourceVersionMatch", "GET", cms + "?resourceVersionMatch=Bogus&resourceVersion=1", "", "", 422, `resourceVersionMatch: Unsupported value: "Bogus"`},
		{"watch with resourceVersionMatch", "GET", cms + "?watch=1&resourceVersionMatch=NotOlderThan&resourceVersion=1", "", "", 422, "resourceVersionMatch is forbidden for watch"},
		// Server-side apply's bad input, answered as Kubernetes answers it,
		// except a configuration its schema cannot hold: Kubernetes says
		// 500 to that, orch 400 with the same words.
		{"apply without a field manager", "PATCH", cms + "/target", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap"}`, 422, "fieldManager: Required value"},
		{"force on a merge patch", "PATCH", cms + "/target?force=true", "application/merge-patch+json", `{}`, 422, "force: Forbidden"},
		{"apply of another kind", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"Secret"}`, 400, "does not match the expected kind"},
		{"apply of another version", "PATCH", "/apis/apps/v1/namespaces/default/deployments/d?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"apps/v1beta1","kind":"Deployment"}`, 400, "invalid object type: apps/v1beta1"},
		{"apply without a kind", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", `{"data":{"a":"b"}}`, 400, "must set apiVersion and kind"},
		{"apply of an unknown field", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","dataa":{}}`, 400, "field not declared in schema"},
		{"apply of a wrong type", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","data":["a"]}`, 400, ".data"},
		{"apply with managedFields", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"managedFields":[{"manager":"x"}]}}`, 400, "metadata.managedFields must be nil"},
		{"apply that is not YAML", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", "kind: [", 400, "error decoding YAML"},
		{"apply with a duplicate field, strict", "PATCH", cms + "/target?fieldManager=t&fieldValidation=Strict", "application/apply-patch+yaml", "apiVersion: v1\nkind: ConfigMap\nkind: ConfigMap\n", 400, "error strict decoding YAML"},
		{"apply of another name", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"other"}}`, 400, "does not match the name on the URL"},
		{"apply with a uid, creating", "PATCH", cms + "/new-one?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"uid":"1234"}}`, 409, "uid mismatch"},
		{"apply in CBOR", "PATCH", cms + "/target?fieldManager=t", "application/apply-patch+cbor", "\xa0", 415, "unknown format"},
		{"apply to a scale", "PATCH", "/apis/apps/v1/namespaces/default/deployments/d/scale?fieldManager=t", "application/apply-patch+yaml", `{"apiVersion":"autoscaling/v1","kind":"Scale"}`, 415, "not on scale"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, _ := ts.rawRequest(t, tc.method, tc.path, tc.contentType, tc.body)
			if code != tc.code {
				t.Fatalf("code %d, want %d: %s", code, tc.code, body)
			}
			var st metav1.Status
			if err := json.Unmarshal([]byte(body), &st); err != nil || st.Kind != "Status" || int(st.Code) != tc.code {
				t.Fatalf("body is not a Status with code %d: %s", tc.code, body)
			}
			if !strings.Contains(st.Message, tc.message) {
				t.Errorf("message %q does not contain %q", st.Message, tc.message)
			}
		})
	}
	t.Run("a refused dry run wrote nothing", func(t *testing.T) {
		if code, body, _ := ts.rawRequest(t, "GET", cms+"/dry", "", ""); code != 404 {
			t.Fatalf("after POST ?dryRun=Bogus: GET %d %s", code, body)
		}
	})
	t.Run("unknown field warns by default", func(t *testing.T) {
		code, body, hdr := ts.rawRequest(t, "POST", cms, "application/json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"warned"},"dataa":{}}`)
		if code != 201 || !strings.Contains(hdr.Get("Warning"), `unknown field \"dataa\"`) {
			t.Fatalf("code %d warning %q: %s", code, hdr.Get("Warning"), body)
		}
	})
}

func TestAuthentication(t *testing.T) {
	ts := startServer(t, "")
	anon := insecureClient()
	for path, want := range map[string]int{
		"/healthz": 200, "/livez": 200, "/readyz": 200, "/version": 200, "/cacerts": 200,
		"/api/v1/namespaces": 401, "/api": 401, "/apis/apps/v1/deployments": 401,
	} {
		resp, err := anon.Get(ts.srv.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("anonymous GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	as := func(user string, groups ...string) *http.Client { return ts.as(t, user, groups...).client }
	get := func(c *http.Client, method, path, body string) int {
		req, _ := http.NewRequestWithContext(context.Background(), method, ts.srv.URL()+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		return resp.StatusCode
	}
	alice := as("alice", "developers")
	if code := get(alice, "GET", "/api/v1/namespaces", ""); code != 403 {
		t.Errorf("user without a role lists namespaces: %d, want 403", code)
	}
	if code := get(alice, "GET", "/api", ""); code != 200 {
		t.Errorf("user reads discovery: %d, want 200", code)
	}
	node := as("system:node:n1", "system:nodes")
	nodeBody := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}`
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/api/v1/nodes", nodeBody, 201},
		{"GET", "/api/v1/nodes/n1", "", 200},
		{"DELETE", "/api/v1/nodes/n2", "", 403},
		{"GET", "/api/v1/namespaces/default/secrets", "", 403},
		{"GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt", "", 403},
		{"GET", "/api/v1/pods", "", 403}, // only with spec.nodeName=n1, as Kubernetes 1.32+
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", "", 200},
		{"POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n1"}}`, 201},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n2", `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n2"}}`, 403},
	} {
		if code := get(node, tc.method, tc.path, tc.body); code != tc.want {
			t.Errorf("node %s %s: %d, want %d", tc.method, tc.path, code, tc.want)
		}
	}
}
