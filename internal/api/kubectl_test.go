package api_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kubectl is stock kubectl against one test server.
type kubectl struct{ *apitest.Kubectl }

func newKubectl(t *testing.T, ts *testServer) kubectl {
	return kubectl{apitest.NewKubectl(t, ts.kubeconfig)}
}

// For is k failing t, a subtest, instead of the test it was made for.
func (k kubectl) For(t *testing.T) kubectl { return kubectl{k.Kubectl.For(t)} }

func (k kubectl) run(args ...string) string                           { return k.Run(args...) }
func (k kubectl) try(args ...string) (string, error)                  { return k.Try(args...) }
func (k kubectl) tryEnv(env []string, args ...string) (string, error) { return k.TryEnv(env, args...) }

const appManifest = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports:
        - containerPort: 80
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - port: 80
    targetPort: 80
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
data:
  mode: fast
---
apiVersion: v1
kind: Secret
metadata:
  name: web-secret
stringData:
  password: hunter2
`

// TestKubectl drives the current kubectl release through what a user does
// with an application: apply a manifest, look at it, change it, delete it.
func TestKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	dir := t.TempDir()
	manifest := filepath.Join(dir, "app.yaml")
	write(t, manifest, appManifest)
	ctx := context.Background()

	// apply validates against the server (kubectl reads the OpenAPI
	// document to learn the server does fieldValidation), so no
	// --validate=false is needed.
	out := k.run("apply", "-f", manifest)
	for _, want := range []string{"deployment.apps/web created", "service/web created", "configmap/web-config created", "secret/web-secret created"} {
		if !strings.Contains(out, want) {
			t.Errorf("apply said %q, want %q", out, want)
		}
	}
	secret, err := ts.client.CoreV1().Secrets("default").Get(ctx, "web-secret", metav1.GetOptions{})
	if err != nil || string(secret.Data["password"]) != "hunter2" {
		t.Fatalf("secret after apply: %v %v", secret, err)
	}

	t.Run("get table", func(t *testing.T) {
		k := k.For(t)
		out := k.run("get", "deploy,svc,cm")
		wantLines(t, out,
			`NAME\s+READY\s+UP-TO-DATE\s+AVAILABLE\s+AGE`, `deployment.apps/web\s+0/2\s+0\s+0\s+\d+s`,
			`NAME\s+TYPE\s+CLUSTER-IP\s+EXTERNAL-IP\s+PORT\(S\)\s+AGE`, `service/web\s+ClusterIP\s+10\.43\.\d+\.\d+\s+<none>\s+80/TCP`,
			`NAME\s+DATA\s+AGE`, `configmap/web-config\s+1\s+`)
	})
	t.Run("get wide", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("get", "svc", "web", "-o", "wide"), `NAME\s+TYPE\s+CLUSTER-IP\s+EXTERNAL-IP\s+PORT\(S\)\s+AGE\s+SELECTOR`, `web\s+ClusterIP.*app=web$`)
		wantLines(t, k.run("get", "deploy", "web", "-o", "wide"), `CONTAINERS\s+IMAGES\s+SELECTOR`, `web\s+nginx:1\.27\s+app=web$`)
	})
	t.Run("get yaml", func(t *testing.T) {
		k := k.For(t)
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(k.run("get", "deploy", "web", "-o", "yaml")), &d); err != nil {
			t.Fatal(err)
		}
		// Kubernetes' defaults, applied by the server.
		if *d.Spec.Replicas != 2 || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
			d.Spec.Strategy.RollingUpdate.MaxSurge.String() != "25%" || *d.Spec.RevisionHistoryLimit != 10 ||
			d.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways ||
			d.Annotations[corev1.LastAppliedConfigAnnotation] == "" {
			t.Errorf("deployment as yaml: %+v", d)
		}
	})
	t.Run("describe", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("describe", "deployment", "web"), `^Name:\s+web$`, `^Replicas:\s+2 desired`, `^StrategyType:\s+RollingUpdate$`, `Image:\s+nginx:1\.27`)
		wantLines(t, k.run("describe", "service", "web"), `^Selector:\s+app=web$`, `^IP:\s+10\.43\.`, `^Port:\s+<unset>\s+80/TCP$`)
	})
	t.Run("label and annotate", func(t *testing.T) {
		k := k.For(t)
		k.run("label", "configmap", "web-config", "tier=frontend")
		wantLines(t, k.run("get", "cm", "-l", "tier=frontend", "-o", "name"), `^configmap/web-config$`)
		if out := k.run("get", "cm", "-l", "tier=backend"); !strings.Contains(out, "No resources found") {
			t.Errorf("selector matched: %s", out)
		}
		k.run("annotate", "deployment", "web", "owner=team-a")
		d, err := ts.client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || d.Annotations["owner"] != "team-a" {
			t.Errorf("annotation: %v %v", d.Annotations, err)
		}
	})
	t.Run("patch", func(t *testing.T) {
		k := k.For(t)
		k.run("patch", "deployment", "web", "-p", `{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.28"}]}}}}`)
		k.run("patch", "configmap", "web-config", "--type=merge", "-p", `{"data":{"size":"large"}}`)
		k.run("patch", "service", "web", "--type=json", "-p", `[{"op":"replace","path":"/spec/ports/0/targetPort","value":8080}]`)
		d, _ := ts.client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if c := d.Spec.Template.Spec.Containers; len(c) != 1 || c[0].Image != "nginx:1.28" || len(c[0].Ports) != 1 {
			t.Errorf("strategic merge patch merged containers by name into %+v", c)
		}
		cm, _ := ts.client.CoreV1().ConfigMaps("default").Get(ctx, "web-config", metav1.GetOptions{})
		if cm.Data["size"] != "large" || cm.Data["mode"] != "fast" {
			t.Errorf("merge patch: %v", cm.Data)
		}
		svc, _ := ts.client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if svc.Spec.Ports[0].TargetPort.IntValue() != 8080 {
			t.Errorf("json patch: %+v", svc.Spec.Ports)
		}
	})
	t.Run("edit", func(t *testing.T) {
		k := k.For(t)
		editor := filepath.Join(dir, "editor.sh")
		write(t, editor, "#!/bin/sh\nsed -i 's/mode: fast/mode: careful/' \"$1\"\n")
		if err := os.Chmod(editor, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := k.tryEnv([]string{"EDITOR=" + editor, "KUBE_EDITOR=" + editor}, "edit", "configmap", "web-config")
		if err != nil || !strings.Contains(out, "configmap/web-config edited") {
			t.Fatalf("edit: %v\n%s", err, out)
		}
		cm, _ := ts.client.CoreV1().ConfigMaps("default").Get(ctx, "web-config", metav1.GetOptions{})
		if cm.Data["mode"] != "careful" || cm.Labels["tier"] != "frontend" {
			t.Errorf("after edit: %v %v", cm.Data, cm.Labels)
		}
	})
	t.Run("scale", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("scale", "deployment", "web", "--replicas=5"), `^deployment.apps/web scaled$`)
		d, _ := ts.client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if *d.Spec.Replicas != 5 {
			t.Errorf("replicas %d", *d.Spec.Replicas)
		}
		if _, err := k.try("scale", "deployment", "web", "--current-replicas=3", "--replicas=1"); err == nil {
			t.Error("scale with a wrong --current-replicas precondition succeeded")
		}
	})
	t.Run("apply again", func(t *testing.T) {
		k := k.For(t)
		// A three-way merge: what the manifest sets wins again (the
		// service's targetPort, matched by port), what others added (the
		// label, the configmap's "size") stays.
		write(t, manifest, strings.Replace(appManifest, "mode: fast", "mode: steady", 1))
		wantLines(t, k.run("apply", "-f", manifest), `^deployment.apps/web configured$`, `^service/web configured$`, `^configmap/web-config configured$`)
		cm, _ := ts.client.CoreV1().ConfigMaps("default").Get(ctx, "web-config", metav1.GetOptions{})
		if cm.Data["mode"] != "steady" || cm.Data["size"] != "large" || cm.Labels["tier"] != "frontend" {
			t.Errorf("after re-apply: %v %v", cm.Data, cm.Labels)
		}
		svc, _ := ts.client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.IntValue() != 80 {
			t.Errorf("service ports after re-apply: %+v", svc.Spec.Ports)
		}
		if out := k.run("apply", "-f", manifest); !strings.Contains(out, "service/web unchanged") {
			t.Errorf("a second identical apply changed the service: %s", out)
		}
	})
	t.Run("bad manifests", func(t *testing.T) {
		k := k.For(t)
		bad := filepath.Join(dir, "bad.yaml")
		write(t, bad, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: typo\ndata: {a: b}\nbogus: 1\n")
		if out, err := k.try("apply", "-f", bad); err == nil || !strings.Contains(out, `unknown field "bogus"`) {
			t.Errorf("unknown field: %v %s", err, out)
		}
		write(t, bad, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n")
		if out, err := k.try("apply", "-f", bad); err == nil || !strings.Contains(out, `metadata.name: Invalid value: "Bad_Name"`) {
			t.Errorf("invalid name: %v %s", err, out)
		}
	})
	t.Run("explain", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("explain", "deployment.spec.strategy"), `^KIND:\s+Deployment$`, `^\s+rollingUpdate\s+<RollingUpdateDeployment>`)
		// With Kubernetes' descriptions of the fields.
		wantLines(t, k.run("explain", "pod.spec.containers"), `^\s+List of containers belonging to the pod\.`, `^\s+image\s+<string>`, `^\s+Container image name\.`)
	})
	t.Run("unknown resource type", func(t *testing.T) {
		k := k.For(t)
		if out, err := k.try("get", "widgets"); err == nil || !strings.Contains(out, `the server doesn't have a resource type "widgets"`) {
			t.Errorf("kubectl get widgets: %v %s", err, out)
		}
		// Validation reads /openapi/v2 when v3 has no such group; without it
		// kubectl said "error validating data: the server could not find
		// the requested resource".
		widget := filepath.Join(dir, "widget.yaml")
		write(t, widget, "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n")
		if out, err := k.try("apply", "-f", widget); err == nil || !strings.Contains(out, `no matches for kind "Widget" in version "example.com/v1"`) {
			t.Errorf("kubectl apply of an unknown kind: %v %s", err, out)
		}
	})
	t.Run("version", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("version"), `^Client Version: v1\.`, `^Server Version: v1\.\d+\.\d+\+orch`)
	})
	t.Run("get all", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("get", "all"), `^service/kubernetes\s+ClusterIP\s+10\.43\.0\.1\s+<none>\s+443/TCP`, `^service/web\s+`, `^deployment.apps/web\s+`)
		wantLines(t, k.run("get", "all", "-A"), `^default\s+service/kubernetes\s+`)
	})
	t.Run("delete", func(t *testing.T) {
		k := k.For(t)
		wantLines(t, k.run("delete", "-f", manifest), `deployment.apps "web" deleted`, `service "web" deleted`, `configmap "web-config" deleted`, `secret "web-secret" deleted`)
		if _, err := ts.client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("service after delete: %v", err)
		}
		if out, err := k.try("get", "deployment", "web"); err == nil || !strings.Contains(out, `deployments.apps "web" not found`) {
			t.Errorf("get after delete: %v %s", err, out)
		}
	})
}

// TestKubectlWatch: `kubectl get -w` prints the list, then each change.
func TestKubectlWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	k.run("create", "configmap", "first", "--from-literal=a=1")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := k.Command(ctx, nil, "get", "configmaps", "-w", "--output-watch-events")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan string, 100)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	expect := func(pattern string) {
		t.Helper()
		re := regexp.MustCompile(pattern)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("kubectl get -w ended before %q", pattern)
				}
				if re.MatchString(line) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no line matching %q", pattern)
			}
		}
	}
	expect(`^ADDED\s+first\s+1\s+`)
	k.run("create", "configmap", "second", "--from-literal=a=1", "--from-literal=b=2")
	expect(`^ADDED\s+second\s+2\s+`)
	k.run("label", "configmap", "first", "x=y")
	expect(`^MODIFIED\s+first\s+1\s+`)
	k.run("delete", "configmap", "second")
	expect(`^DELETED\s+second\s+2\s+`)
}

// wantLines checks that each pattern matches some line of out.
func wantLines(t *testing.T, out string, patterns ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, p := range patterns {
		re := regexp.MustCompile(p)
		found := false
		for _, l := range lines {
			if re.MatchString(l) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no line matches %q in:\n%s", p, out)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
