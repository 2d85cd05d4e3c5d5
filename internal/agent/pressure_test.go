package agent

import (
	"errors"
	"testing"

	"github.com/orch-dev/orch/internal/agent/eviction"
	corev1 "k8s.io/api/core/v1"
)

// Pressure as the kubelet's default hard eviction thresholds judge it.
func TestPressureConditions(t *testing.T) {
	fine := readings{memAvailable: 1 << 30, disk: eviction.Filesystem{Size: 100, Available: 50, Inodes: 100, InodesFree: 50}, pidsInUse: 300, pidsMax: 32768}
	for _, tc := range []struct {
		name   string
		change func(*readings)
		want   map[corev1.NodeConditionType]corev1.ConditionStatus
	}{
		{"all fine", func(*readings) {}, map[corev1.NodeConditionType]corev1.ConditionStatus{}},
		{"memory under 100Mi", func(r *readings) { r.memAvailable = 99 << 20 }, map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodeMemoryPressure: corev1.ConditionTrue}},
		{"disk under 10%", func(r *readings) { r.disk.Available = 9 }, map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodeDiskPressure: corev1.ConditionTrue}},
		{"inodes under 5%", func(r *readings) { r.disk.InodesFree = 4 }, map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodeDiskPressure: corev1.ConditionTrue}},
		{"pids nearly gone", func(r *readings) { r.pidsInUse = 32000 }, map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodePIDPressure: corev1.ConditionTrue}},
		{"unreadable memory is no pressure", func(r *readings) { r.memAvailable, r.memErr = 0, errors.New("no /proc") }, map[corev1.NodeConditionType]corev1.ConditionStatus{}},
	} {
		r := fine
		tc.change(&r)
		conds := pressureConditions(r)
		if len(conds) != 3 {
			t.Errorf("%s: %d conditions, want memory, disk and PID pressure: %+v", tc.name, len(conds), conds)
		}
		for _, c := range conds {
			want := tc.want[c.Type]
			if want == "" {
				want = corev1.ConditionFalse
			}
			if c.Status != want {
				t.Errorf("%s: %s is %s, want %s", tc.name, c.Type, c.Status, want)
			}
		}
	}
	// This machine's own readings parse.
	if r := readNode(t.TempDir()); r.memErr != nil || r.diskErr != nil || r.pidsErr != nil || r.pidsMax == 0 {
		t.Errorf("reading this machine: %+v", r)
	}
}
