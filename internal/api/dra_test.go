package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// invalidAt says err is a 422 naming path (and, when given, a reason in
// its message).
func invalidAt(err error, path, reason string) bool {
	if !apierrors.IsInvalid(err) {
		return false
	}
	for _, c := range err.(apierrors.APIStatus).Status().Details.Causes {
		if c.Field == path && strings.Contains(c.Message, reason) {
			return true
		}
	}
	return false
}

// TestDynamicResourceAllocationKinds: resource.k8s.io/v1 as Kubernetes
// serves it: a claim's requests take their defaults and its spec is
// immutable; its status is allocated once, reserved only when allocated,
// and applied server-side; a class's selectors must compile to a bool;
// slices are selected by node, driver and pool, and say where their
// devices are exactly one way; a taint rule's TimeAdded follows its
// effect.
func TestDynamicResourceAllocationKinds(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	dra := ts.client.ResourceV1()

	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{
			{Name: "one", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com",
				Tolerations: []resourcev1.DeviceToleration{{Key: "example.com/broken"}}}},
			{Name: "any", FirstAvailable: []resourcev1.DeviceSubRequest{{Name: "big", DeviceClassName: "gpu.example.com"}}},
		},
		Constraints: []resourcev1.DeviceConstraint{{Requests: []string{"one", "any/big"}, MatchAttribute: ptr.To[resourcev1.FullyQualifiedName]("gpu.example.com/model")}},
	}}}
	made, err := dra.ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one, big := made.Spec.Devices.Requests[0].Exactly, made.Spec.Devices.Requests[1].FirstAvailable[0]
	if one.AllocationMode != resourcev1.DeviceAllocationModeExactCount || one.Count != 1 || one.Tolerations[0].Operator != resourcev1.DeviceTolerationOpEqual ||
		big.AllocationMode != resourcev1.DeviceAllocationModeExactCount || big.Count != 1 {
		t.Errorf("a claim's defaults: %+v %+v", one, big)
	}

	for _, tc := range []struct {
		name         string
		change       func(c *resourcev1.ResourceClaim)
		path, reason string
	}{
		{"a request naming no class", func(c *resourcev1.ResourceClaim) { c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "" },
			"spec.devices.requests[0].exactly.deviceClassName", "Required"},
		{"both ways of asking", func(c *resourcev1.ResourceClaim) {
			c.Spec.Devices.Requests[1].Exactly = &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}
		}, "spec.devices.requests[1]", "exactly one of"},
		{"a constraint on no request", func(c *resourcev1.ResourceClaim) { c.Spec.Devices.Constraints[0].Requests[1] = "any/small" },
			"spec.devices.constraints[0].requests[1]", "must be the name of a request"},
		{"a count with All", func(c *resourcev1.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.AllocationMode, c.Spec.Devices.Requests[0].Exactly.Count = resourcev1.DeviceAllocationModeAll, 2
		}, "spec.devices.requests[0].exactly.count", "must not be specified"},
		{"a selector that does not compile", func(c *resourcev1.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: "device.driver =="}}}
		}, "spec.devices.requests[0].exactly.selectors[0].cel.expression", "compilation failed"},
	} {
		bad := claim.DeepCopy()
		bad.Name = "bad"
		tc.change(bad)
		if _, err := dra.ResourceClaims("default").Create(ctx, bad, metav1.CreateOptions{}); !invalidAt(err, tc.path, tc.reason) {
			t.Errorf("%s: want 422 at %s (%s), got %v", tc.name, tc.path, tc.reason, err)
		}
	}

	// The spec is immutable; labels are not.
	changed := made.DeepCopy()
	changed.Spec.Devices.Requests[0].Exactly.Count = 2
	if _, err := dra.ResourceClaims("default").Update(ctx, changed, metav1.UpdateOptions{}); !invalidAt(err, "spec", "immutable") {
		t.Errorf("a claim's spec changed: %v", err)
	}
	if _, err := dra.ResourceClaims("default").Patch(ctx, "gpu", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("a claim's label: %v", err)
	}

	// Status: no reservation before an allocation; an allocation applied
	// server-side (as a scheduler's DRA plugin writes it); then no change.
	reserved := `{"status":{"reservedFor":[{"resource":"pods","name":"p","uid":"0b7c3b1e-6f0c-4a39-9c1e-5b0f4c2a9e11"}]}}`
	if _, err := dra.ResourceClaims("default").Patch(ctx, "gpu", types.MergePatchType, []byte(reserved), metav1.PatchOptions{}, "status"); !invalidAt(err, "status.reservedFor", "may not be specified") {
		t.Errorf("a reservation before an allocation: %v", err)
	}
	apply := `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"gpu","namespace":"default"},"status":{"allocation":{"devices":{"results":[
		{"request":"one","driver":"gpu.example.com","pool":"n1","device":"gpu-0"}]}}}}`
	allocated, err := dra.ResourceClaims("default").Patch(ctx, "gpu", types.ApplyPatchType, []byte(apply), metav1.PatchOptions{FieldManager: "scheduler"}, "status")
	if err != nil || allocated.Status.Allocation == nil || len(allocated.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("an allocation applied: %v %+v", err, allocated)
	}
	if _, err := dra.ResourceClaims("default").Patch(ctx, "gpu", types.MergePatchType, []byte(reserved), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("a reservation once allocated: %v", err)
	}
	moved := `{"status":{"allocation":{"devices":{"results":[{"request":"one","driver":"gpu.example.com","pool":"n1","device":"gpu-1"}]}}}}`
	if _, err := dra.ResourceClaims("default").Patch(ctx, "gpu", types.MergePatchType, []byte(moved), metav1.PatchOptions{}, "status"); !invalidAt(err, "status.allocation", "immutable") {
		t.Errorf("an allocation changed: %v", err)
	}

	// A class's selector must give a bool; a template is immutable too.
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com"}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `"gpu"`}}}}}
	if _, err := dra.DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); !invalidAt(err, "spec.selectors[0].cel.expression", "must evaluate to bool") {
		t.Errorf("a selector giving a string: %v", err)
	}
	class.Spec.Selectors[0].CEL.Expression = `device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "a100"`
	if _, err := dra.DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Errorf("a selector on attributes: %v", err)
	}
	tmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourcev1.ResourceClaimTemplateSpec{Spec: claim.Spec}}
	tmpl, err = dra.ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Spec.Spec.Devices.Requests[0].Name = "two"
	if _, err := dra.ResourceClaimTemplates("default").Update(ctx, tmpl, metav1.UpdateOptions{}); !invalidAt(err, "spec", "immutable") {
		t.Errorf("a template's spec changed: %v", err)
	}

	// Slices: one way to say where the devices are; selected by field.
	for _, node := range []string{"n1", "n2"} {
		slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpus"}, Spec: resourcev1.ResourceSliceSpec{
			Driver: "gpu.example.com", NodeName: ptr.To(node), Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"model": {StringValue: ptr.To("a100")}}}}}}
		if _, err := dra.ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	onN1, err := dra.ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1,spec.driver=gpu.example.com"})
	if err != nil || len(onN1.Items) != 1 || onN1.Items[0].Name != "n1-gpus" {
		t.Errorf("slices of n1: %v %v", onN1, err)
	}
	twoWays := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "both"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "gpu.example.com", NodeName: ptr.To("n1"), AllNodes: ptr.To(true), Pool: resourcev1.ResourcePool{Name: "p", ResourceSliceCount: 1}}}
	if _, err := dra.ResourceSlices().Create(ctx, twoWays, metav1.CreateOptions{}); !invalidAt(err, "spec", "exactly one of") {
		t.Errorf("a slice on a node and on all: %v", err)
	}
	dup := twoWays.DeepCopy()
	dup.Spec.AllNodes = nil
	dup.Spec.Devices = []resourcev1.Device{{Name: "gpu-0"}, {Name: "gpu-0"}}
	if _, err := dra.ResourceSlices().Create(ctx, dup, metav1.CreateOptions{}); !invalidAt(err, "spec.devices[1].name", "Duplicate") {
		t.Errorf("two devices of one name: %v", err)
	}

	// A taint rule: TimeAdded defaulted, and moved when the effect changes.
	long := metav1.NewTime(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))
	_, err = dra.DeviceTaintRules().Create(ctx, &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: resourcev1.DeviceTaintRuleSpec{
		Taint: resourcev1.DeviceTaint{Key: "example.com/broken", Effect: resourcev1.DeviceTaintEffectNone, TimeAdded: &long}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rule, err := dra.DeviceTaintRules().Patch(ctx, "broken", types.MergePatchType, []byte(`{"spec":{"taint":{"effect":"NoSchedule"}}}`), metav1.PatchOptions{})
	if err != nil || rule.Spec.Taint.TimeAdded == nil || !rule.Spec.Taint.TimeAdded.After(long.Time) || rule.Generation != 2 {
		t.Errorf("a taint rule's effect changed: %v %+v (generation %d)", err, rule.Spec.Taint, rule.Generation)
	}
	noTime, err := dra.DeviceTaintRules().Create(ctx, &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "now"}, Spec: resourcev1.DeviceTaintRuleSpec{
		Taint: resourcev1.DeviceTaint{Key: "example.com/broken", Effect: resourcev1.DeviceTaintEffectNoExecute}}}, metav1.CreateOptions{})
	if err != nil || noTime.Spec.Taint.TimeAdded == nil {
		t.Errorf("a taint's TimeAdded not defaulted: %v %+v", err, noTime)
	}
}
