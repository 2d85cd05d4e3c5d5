package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

// plainKind is a kind the server stores and serves with nothing acting on
// it, as the conformance suite's "API operations" specs use it.
type plainKind struct {
	gvr        schema.GroupVersionResource
	namespaced bool
	// statusPatch, when the kind has a status subresource, changes it.
	statusPatch string
	// object makes a valid object of the kind named name.
	object func(name string) runtime.Object
	// invalid is an object the server must refuse, at the field path.
	invalid     runtime.Object
	invalidPath string
	// named maps a test's name to the object's own when the kind fixes
	// its names (an IPAddress is named by its address).
	named map[string]string
}

func plainKinds() []plainKind {
	return []plainKind{
		{
			gvr: corev1.SchemeGroupVersion.WithResource("podtemplates"), namespaced: true,
			object: func(name string) runtime.Object {
				return &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}
			},
			invalid: &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}},
			invalidPath: "template.spec.containers[0].image",
		},
		{
			gvr: nodev1.SchemeGroupVersion.WithResource("runtimeclasses"),
			object: func(name string) runtime.Object {
				return &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: name + "-handler"}
			},
			invalid:     &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Handler: "Not_A_Label"},
			invalidPath: "handler",
		},
		{
			gvr: networkingv1.SchemeGroupVersion.WithResource("servicecidrs"),
			object: func(name string) runtime.Object {
				third := map[string]string{"servicecidrs-0": "10.100.0.0/24", "servicecidrs-1": "10.100.1.0/24", "servicecidrs-2": "fd00:100::/64"}[name]
				return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{third}}}
			},
			statusPatch: `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`,
			invalid:     &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.0.0.1/8"}}},
			invalidPath: "spec.cidrs[0]",
		},
		{
			gvr: networkingv1.SchemeGroupVersion.WithResource("ipaddresses"),
			object: func(name string) runtime.Object {
				addr := map[string]string{"ipaddresses-0": "255.255.255.255", "ipaddresses-1": "fe80::42:1dff:fe84:f9e2", "ipaddresses-2": "10.1.2.3"}[name]
				return &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: addr}, Spec: networkingv1.IPAddressSpec{
					ParentRef: &networkingv1.ParentReference{Group: "mygroup", Resource: "myresources", Namespace: "foo", Name: "bar"}}}
			},
			named:       map[string]string{"ipaddresses-0": "255.255.255.255"},
			invalid:     &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "10.1.2.3"}},
			invalidPath: "spec.parentRef",
		},
		{
			gvr: storagev1.SchemeGroupVersion.WithResource("csidrivers"),
			object: func(name string) runtime.Object {
				return &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name + ".example.com"}}
			},
			named:       map[string]string{"csidrivers-0": "csidrivers-0.example.com"},
			invalid:     &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "bad.example.com"}, Spec: storagev1.CSIDriverSpec{VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{"Sometimes"}}},
			invalidPath: "spec.volumeLifecycleModes[0]",
		},
		{
			gvr: storagev1.SchemeGroupVersion.WithResource("csinodes"),
			object: func(name string) runtime.Object {
				return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSINodeSpec{
					Drivers: []storagev1.CSINodeDriver{{Name: "example.com", NodeID: name}}}}
			},
			invalid:     &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "example.com"}}}},
			invalidPath: "spec.drivers[0].nodeID",
		},
		{
			gvr: storagev1.SchemeGroupVersion.WithResource("csistoragecapacities"), namespaced: true,
			object: func(name string) runtime.Object {
				return &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: name}, StorageClassName: "local-path", Capacity: ptr.To(resource.MustParse("1Gi"))}
			},
			invalid:     &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, StorageClassName: "Not_A_Class"},
			invalidPath: "storageClassName",
		},
		{
			gvr: storagev1.SchemeGroupVersion.WithResource("volumeattachments"),
			object: func(name string) runtime.Object {
				return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.VolumeAttachmentSpec{
					Attacher: "example.com", NodeName: "n1", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-" + name)}}}
			},
			statusPatch: `{"status":{"attached":true}}`,
			invalid:     &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: storagev1.VolumeAttachmentSpec{Attacher: "example.com", NodeName: "n1"}},
			invalidPath: "spec.source",
		},
		{
			gvr: storagev1.SchemeGroupVersion.WithResource("volumeattributesclasses"),
			object: func(name string) runtime.Object {
				return &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: "example.com", Parameters: map[string]string{"iops": "100"}}
			},
			invalid:     &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Parameters: map[string]string{"iops": "100"}},
			invalidPath: "driverName",
		},
		{
			gvr: flowcontrolv1.SchemeGroupVersion.WithResource("flowschemas"),
			object: func(name string) runtime.Object {
				return &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: flowcontrolv1.FlowSchemaSpec{
					PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "global-default"}}}
			},
			statusPatch: `{"status":{"conditions":[{"type":"Dangling","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`,
			invalid: &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: flowcontrolv1.FlowSchemaSpec{
				PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "x"}, MatchingPrecedence: 10001}},
			invalidPath: "spec.matchingPrecedence",
		},
		{
			gvr: flowcontrolv1.SchemeGroupVersion.WithResource("prioritylevelconfigurations"),
			object: func(name string) runtime.Object {
				return &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
					Type: flowcontrolv1.PriorityLevelEnablementLimited, Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
						LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}}
			},
			statusPatch: `{"status":{"conditions":[{"type":"Test","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`,
			invalid: &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
				Type: flowcontrolv1.PriorityLevelEnablementLimited}},
			invalidPath: "spec.limited",
		},
		{
			gvr: resourcev1.SchemeGroupVersion.WithResource("deviceclasses"),
			object: func(name string) runtime.Object {
				return &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.DeviceClassSpec{
					Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}}
			},
			invalid: &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: resourcev1.DeviceClassSpec{
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: "device.driver =="}}}}},
			invalidPath: "spec.selectors[0].cel.expression",
		},
		{
			gvr: resourcev1.SchemeGroupVersion.WithResource("resourceclaims"), namespaced: true,
			object: func(name string) runtime.Object {
				return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
					Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}}
			},
			statusPatch: `{"status":{"allocation":{}}}`,
			invalid: &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{}}}}}},
			invalidPath: "spec.devices.requests[0].exactly.deviceClassName",
		},
		{
			gvr: resourcev1.SchemeGroupVersion.WithResource("resourceclaimtemplates"), namespaced: true,
			object: func(name string) runtime.Object {
				return &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceClaimTemplateSpec{
					Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
						Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}}}
			},
			invalid: &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: resourcev1.ResourceClaimTemplateSpec{
				Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "Not_A_Label",
					Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}}},
			invalidPath: "spec.spec.devices.requests[0].name",
		},
		{
			gvr: resourcev1.SchemeGroupVersion.WithResource("resourceslices"),
			object: func(name string) runtime.Object {
				return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
					Driver: "gpu.example.com", NodeName: ptr.To("n1"), Pool: resourcev1.ResourcePool{Name: name, ResourceSliceCount: 1},
					Devices: []resourcev1.Device{{Name: "gpu-0"}}}}
			},
			invalid: &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: resourcev1.ResourceSliceSpec{
				Driver: "gpu.example.com", AllNodes: ptr.To(true), Pool: resourcev1.ResourcePool{Name: "p", ResourceSliceCount: 0}}},
			invalidPath: "spec.pool.resourceSliceCount",
		},
		{
			gvr: resourcev1.SchemeGroupVersion.WithResource("devicetaintrules"),
			object: func(name string) runtime.Object {
				return &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.DeviceTaintRuleSpec{
					Taint: resourcev1.DeviceTaint{Key: "example.com/broken", Effect: resourcev1.DeviceTaintEffectNone}}}
			},
			statusPatch: `{"status":{"conditions":[{"type":"Test","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`,
			invalid: &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: resourcev1.DeviceTaintRuleSpec{
				Taint: resourcev1.DeviceTaint{Key: "example.com/broken", Effect: "Sometimes"}}},
			invalidPath: "spec.taint.effect",
		},
	}
}

// TestPlainKindsLifecycle drives each plain kind as the conformance suite
// does: discovery lists it; create, get, list and watch by label, merge
// patch, update, status update, invalid objects refused with their field,
// delete and deletecollection, each seen by the watch.
func TestPlainKindsLifecycle(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(ts.config)
	disco := discovery.NewDiscoveryClientForConfigOrDie(ts.config)
	for _, k := range plainKinds() {
		t.Run(k.gvr.Resource, func(t *testing.T) {
			list, err := disco.ServerResourcesForGroupVersion(k.gvr.GroupVersion().String())
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, r := range list.APIResources {
				found = found || r.Name == k.gvr.Resource && r.Namespaced == k.namespaced
			}
			if !found {
				t.Fatalf("discovery of %s lists no %s", k.gvr.GroupVersion(), k.gvr.Resource)
			}
			var client dynamic.ResourceInterface = dyn.Resource(k.gvr)
			if k.namespaced {
				client = dyn.Resource(k.gvr).Namespace("default")
			}
			label := metav1.ListOptions{LabelSelector: "e2e=" + k.gvr.Resource}
			start, err := client.List(ctx, label)
			if err != nil {
				t.Fatal(err)
			}
			w, err := client.Watch(ctx, metav1.ListOptions{LabelSelector: label.LabelSelector, ResourceVersion: start.GetResourceVersion()})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			for i := range 3 {
				u := toUnstructured(t, k.object(fmt.Sprintf("%s-%d", k.gvr.Resource, i)))
				u.SetLabels(map[string]string{"e2e": k.gvr.Resource})
				if _, err := client.Create(ctx, u, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			name := k.gvr.Resource + "-0"
			if n, ok := k.named[name]; ok {
				name = n
			}
			got, err := client.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if items, err := client.List(ctx, label); err != nil || len(items.Items) != 3 {
				t.Fatalf("list by label: %d items, %v", len(items.Items), err)
			}
			patched, err := client.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"patched":"true"}}}`), metav1.PatchOptions{})
			if err != nil || patched.GetAnnotations()["patched"] != "true" {
				t.Fatalf("patch: %v", err)
			}
			patched.SetAnnotations(map[string]string{"updated": "true"})
			updated, err := client.Update(ctx, patched, metav1.UpdateOptions{})
			if err != nil || updated.GetResourceVersion() == got.GetResourceVersion() {
				t.Fatalf("update: %v", err)
			}
			if k.statusPatch != "" {
				if _, err := client.Patch(ctx, name, types.MergePatchType, []byte(k.statusPatch), metav1.PatchOptions{}, "status"); err != nil {
					t.Fatalf("status patch: %v", err)
				}
			}
			_, err = client.Create(ctx, toUnstructured(t, k.invalid), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || len(err.(apierrors.APIStatus).Status().Details.Causes) == 0 ||
				err.(apierrors.APIStatus).Status().Details.Causes[0].Field != k.invalidPath {
				t.Fatalf("invalid %s: want 422 at %s, got %v", k.gvr.Resource, k.invalidPath, err)
			}
			if err := client.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := client.DeleteCollection(ctx, metav1.DeleteOptions{}, label); err != nil {
				t.Fatal(err)
			}
			if items, err := client.List(ctx, label); err != nil || len(items.Items) != 0 {
				t.Fatalf("after deletecollection: %d left, %v", len(items.Items), err)
			}
			want := []watch.EventType{watch.Added, watch.Added, watch.Added, watch.Modified, watch.Modified}
			if k.statusPatch != "" {
				want = append(want, watch.Modified)
			}
			want = append(want, watch.Deleted, watch.Deleted, watch.Deleted)
			for i, typ := range want {
				select {
				case ev := <-w.ResultChan():
					if ev.Type != typ {
						t.Fatalf("watch event %d: %s, want %s", i, ev.Type, typ)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("watch: %d of %d events", i, len(want))
				}
			}
		})
	}
}

func toUnstructured(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// TestRuntimeClassAdmission: a pod naming a RuntimeClass that does not
// exist (or no longer does) is refused with 403, as Kubernetes' admission
// refuses it; an existing one's overhead becomes the pod's and its
// scheduling joins the pod's node selector and tolerations; a conflicting
// node selector is refused.
func TestRuntimeClassAdmission(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	pods := ts.client.CoreV1().Pods("default")
	pod := func(name, class string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{RuntimeClassName: &class,
			NodeSelector: map[string]string{"disk": "ssd"}, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	_, err := pods.Create(ctx, pod("p0", "absent"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `pod rejected: RuntimeClass "absent" not found`) {
		t.Fatalf("a missing RuntimeClass: %v", err)
	}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandboxed"}, Handler: "runc",
		Overhead: &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("1Mi")}},
		Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"sandbox": "yes"},
			Tolerations: []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}}}
	if _, err := ts.client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := pods.Create(ctx, pod("p1", "sandboxed"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Overhead.Cpu().String() != "10m" || got.Spec.Overhead.Memory().String() != "1Mi" ||
		got.Spec.NodeSelector["sandbox"] != "yes" || got.Spec.NodeSelector["disk"] != "ssd" || len(got.Spec.Tolerations) == 0 {
		t.Fatalf("admitted pod: overhead %v, node selector %v, tolerations %v", got.Spec.Overhead, got.Spec.NodeSelector, got.Spec.Tolerations)
	}
	conflict := pod("p2", "sandboxed")
	conflict.Spec.NodeSelector["sandbox"] = "no"
	if _, err := pods.Create(ctx, conflict, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("a conflicting node selector: %v", err)
	}
	if err := ts.client.NodeV1().RuntimeClasses().Delete(ctx, "sandboxed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod("p3", "sandboxed"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a deleted RuntimeClass: %v", err)
	}
}

// TestPodGeneration: a pod's generation is 1 at creation whatever the
// client sent, grows with each change of its spec (not of its metadata,
// nor when a client sets it), and once more when its graceful deletion
// begins, as Kubernetes 1.34+ counts it.
func TestPodGeneration(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	pods := ts.client.CoreV1().Pods("default")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gen", Generation: 100}, Spec: corev1.PodSpec{NodeName: "n1",
		Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	got, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil || got.Generation != 1 {
		t.Fatalf("created at generation %d, %v", got.Generation, err)
	}
	want := int64(1)
	for _, step := range []struct {
		name   string
		change func(*corev1.Pod)
		bump   bool
	}{
		{"no change", func(*corev1.Pod) {}, false},
		{"tolerations", func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpEqual, Value: "v", Effect: corev1.TaintEffectNoSchedule}}
		}, true},
		{"activeDeadlineSeconds", func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptr.To[int64](5000) }, true},
		{"image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "nginx" }, true},
		{"annotations", func(p *corev1.Pod) { p.Annotations = map[string]string{"k": "v"} }, false},
		{"generation set by the client", func(p *corev1.Pod) { p.Generation = 1 }, false},
	} {
		change := step.change
		change(got)
		if got, err = pods.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if step.bump {
			want++
		}
		if got.Generation != want {
			t.Fatalf("after %s: generation %d, want %d", step.name, got.Generation, want)
		}
	}
	// Tolerations may only be added to (Kubernetes' rule), in any order.
	removed := got.DeepCopy()
	removed.Spec.Tolerations = removed.Spec.Tolerations[1:]
	if _, err := pods.Update(ctx, removed, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("a toleration removed: want 422, got %v", err)
	}
	if err := pods.Delete(ctx, "gen", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](30)}); err != nil {
		t.Fatal(err)
	}
	if got, err = pods.Get(ctx, "gen", metav1.GetOptions{}); err != nil || got.DeletionTimestamp == nil || got.Generation != want+1 {
		t.Fatalf("graceful deletion: generation %d (want %d), deletionTimestamp %v, %v", got.Generation, want+1, got.DeletionTimestamp, err)
	}
}

// TestStatusWritesMetadata: a write of the status subresource changes the
// metadata Kubernetes lets it change for that kind: all of it for a Job,
// annotations but not labels for a Deployment, none for a FlowSchema.
func TestStatusWritesMetadata(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(ts.config)
	labels := map[string]string{"app": "x"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	always := *tmpl.DeepCopy()
	always.Spec.RestartPolicy = corev1.RestartPolicyAlways
	objects := map[schema.GroupVersionResource]runtime.Object{
		batchv1.SchemeGroupVersion.WithResource("jobs"): &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: tmpl}},
		appsv1.SchemeGroupVersion.WithResource("deployments"): &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: always}},
		flowcontrolv1.SchemeGroupVersion.WithResource("flowschemas"): &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "s"},
			Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "global-default"}}},
	}
	for gvr, want := range map[schema.GroupVersionResource][2]bool{
		batchv1.SchemeGroupVersion.WithResource("jobs"):              {true, true},
		appsv1.SchemeGroupVersion.WithResource("deployments"):        {false, true},
		flowcontrolv1.SchemeGroupVersion.WithResource("flowschemas"): {false, false},
	} {
		var client dynamic.ResourceInterface = dyn.Resource(gvr)
		if gvr.Resource != "flowschemas" {
			client = dyn.Resource(gvr).Namespace("default")
		}
		if _, err := client.Create(ctx, toUnstructured(t, objects[gvr]), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		patch := `{"metadata":{"labels":{"patched":"label"},"annotations":{"patched":"annotation"}},"status":{"conditions":[]}}`
		got, err := client.Patch(ctx, "s", types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got.GetLabels()["patched"]; ok != want[0] {
			t.Errorf("%s: label kept %v, want %v", gvr.Resource, ok, want[0])
		}
		if _, ok := got.GetAnnotations()["patched"]; ok != want[1] {
			t.Errorf("%s: annotation kept %v, want %v", gvr.Resource, ok, want[1])
		}
	}
}

// TestListRemainingItemCount: a paged list says how many items follow
// each page (remainingItemCount), as Kubernetes does, all pages read at
// one resourceVersion; not on the last page, nor when a selector filters
// what follows.
func TestListRemainingItemCount(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	for i := range 40 {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i), Labels: map[string]string{"n": "x"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	total := 40
	if all, err := cms.List(ctx, metav1.ListOptions{}); err == nil {
		total = len(all.Items) // kube-root-ca.crt may be there too
	}
	opts := metav1.ListOptions{Limit: 17}
	seen := 0
	for page := 0; ; page++ {
		list, err := cms.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		seen += len(list.Items)
		if list.Continue == "" {
			if list.RemainingItemCount != nil {
				t.Fatalf("last page: remainingItemCount %d", *list.RemainingItemCount)
			}
			break
		}
		if list.RemainingItemCount == nil || int(*list.RemainingItemCount) != total-seen {
			t.Fatalf("page %d: remainingItemCount %v, want %d", page, list.RemainingItemCount, total-seen)
		}
		opts.Continue = list.Continue
	}
	if seen != total {
		t.Fatalf("%d items paged, %d listed", seen, total)
	}
	filtered, err := cms.List(ctx, metav1.ListOptions{Limit: 5, LabelSelector: "n=x"})
	if err != nil || filtered.Continue == "" || filtered.RemainingItemCount != nil {
		t.Fatalf("a filtered page: continue %q, remainingItemCount %v, %v", filtered.Continue, filtered.RemainingItemCount, err)
	}
}

// TestInconsistentContinue: a continue token whose revision was compacted
// is refused with 410 carrying a token that goes on from the same key at
// the newest revision, as Kubernetes does for a client that takes an
// inconsistent list over starting again; that token's pages count what
// follows them.
func TestInconsistentContinue(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	for i := range 30 {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := cms.List(ctx, metav1.ListOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "zz-later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ts.compact(t)
	_, err = cms.List(ctx, metav1.ListOptions{Limit: 10, Continue: first.Continue})
	status, ok := err.(apierrors.APIStatus)
	if !apierrors.IsResourceExpired(err) || !ok || status.Status().Continue == "" {
		t.Fatalf("a compacted continue token: %v", err)
	}
	second, err := cms.List(ctx, metav1.ListOptions{Limit: 10, Continue: status.Status().Continue})
	if err != nil {
		t.Fatal(err)
	}
	if second.ResourceVersion == first.ResourceVersion || len(second.Items) != 10 || second.Items[0].Name != first.Items[9].Name[:3]+"10" {
		t.Fatalf("the inconsistent page: rv %s (first %s), %d items from %s", second.ResourceVersion, first.ResourceVersion, len(second.Items), second.Items[0].Name)
	}
	total := len(first.Items) + len(second.Items) + int(*second.RemainingItemCount)
	all, _ := cms.List(ctx, metav1.ListOptions{})
	if total != len(all.Items) {
		t.Fatalf("%d counted across the pages, %d there", total, len(all.Items))
	}
}
