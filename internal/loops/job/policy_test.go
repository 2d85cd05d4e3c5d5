package job

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestIntervals: completedIndexes as Kubernetes writes and reads them.
func TestIntervals(t *testing.T) {
	for _, tc := range []struct {
		in          string
		completions int
		add         []int
		want        string
		total       int
	}{
		{"", 5, nil, "", 0},
		{"", 5, []int{3, 1, 2}, "1-3", 3},
		{"0,2", 5, []int{1}, "0-2", 3},
		{"0", 5, []int{1}, "0,1", 2},
		{"1,3-5,7", 10, []int{9}, "1,3-5,7,9", 6},
		{"1,3-5,7", 6, nil, "1,3-5", 4}, // beyond completions: cut
		{"x,2,4-y", 10, nil, "2", 1},    // unreadable parts skipped
		{"3-1", 10, nil, "", 0},
	} {
		got := parseIntervals(tc.in, tc.completions).with(tc.add...)
		if got.String() != tc.want || got.total() != tc.total {
			t.Errorf("%q + %v: %q (%d), want %q (%d)", tc.in, tc.add, got.String(), got.total(), tc.want, tc.total)
		}
	}
	ivs := parseIntervals("1,3-5", 10)
	for ix, want := range map[int]bool{0: false, 1: true, 2: false, 3: true, 5: true, 6: false} {
		if ivs.has(ix) != want {
			t.Errorf("has(%d) = %v", ix, !want)
		}
	}
}

func failedPod(code int32, conds ...corev1.PodConditionType) *corev1.Pod {
	p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}}}}
	for _, c := range conds {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue})
	}
	return p
}

// TestJudgeFailure: the first matching rule decides; exit code 0 never
// matches; NotIn, container names and pod conditions.
func TestJudgeFailure(t *testing.T) {
	policy := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
		{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}},
		{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptr.To("main"), Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{3}}},
		{Action: batchv1.PodFailurePolicyActionFailIndex, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptr.To("other"), Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{4}}},
		{Action: batchv1.PodFailurePolicyActionCount, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpNotIn, Values: []int32{5, 0}}},
	}}
	job := &batchv1.Job{Spec: batchv1.JobSpec{PodFailurePolicy: policy}}
	for _, tc := range []struct {
		pod    *corev1.Pod
		action batchv1.PodFailurePolicyAction
		counts bool
	}{
		{failedPod(3, corev1.DisruptionTarget), batchv1.PodFailurePolicyActionIgnore, false},
		{failedPod(3), batchv1.PodFailurePolicyActionFailJob, true},
		{failedPod(4), batchv1.PodFailurePolicyActionCount, true}, // rule 2 names another container
		{failedPod(5), "", true},
		{failedPod(0), "", true},
	} {
		v := judgeFailure(job, tc.pod)
		if v.action != tc.action || v.counts() != tc.counts || (v.failJob != "") != (tc.action == batchv1.PodFailurePolicyActionFailJob) {
			t.Errorf("exit %d %v: %+v", tc.pod.Status.ContainerStatuses[0].State.Terminated.ExitCode, tc.pod.Status.Conditions, v)
		}
	}
}

// TestMatchSuccessPolicy: succeededIndexes (all of them, or succeededCount
// of them) and succeededCount alone.
func TestMatchSuccessPolicy(t *testing.T) {
	job := func(rules ...batchv1.SuccessPolicyRule) *batchv1.Job {
		return &batchv1.Job{Spec: batchv1.JobSpec{Completions: ptr.To[int32](10), SuccessPolicy: &batchv1.SuccessPolicy{Rules: rules}}}
	}
	for _, tc := range []struct {
		job       *batchv1.Job
		succeeded string
		want      string
	}{
		{job(batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("0-2")}), "0,1", ""},
		{job(batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("0-2")}), "0-3", "Matched rules at index 0"},
		{job(batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("0-4"), SucceededCount: ptr.To[int32](2)}), "4,7,8", ""},
		{job(batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("0-4"), SucceededCount: ptr.To[int32](2)}), "3,4,7", "Matched rules at index 0"},
		{job(batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("9")}, batchv1.SuccessPolicyRule{SucceededCount: ptr.To[int32](3)}), "1-3", "Matched rules at index 1"},
		{job(batchv1.SuccessPolicyRule{SucceededCount: ptr.To[int32](3)}), "", ""},
	} {
		msg, ok := matchSuccessPolicy(tc.job, parseIntervals(tc.succeeded, 10))
		if msg != tc.want || ok != (tc.want != "") {
			t.Errorf("%+v with %q: %q %v, want %q", tc.job.Spec.SuccessPolicy.Rules, tc.succeeded, msg, ok, tc.want)
		}
	}
}

// TestBackoff: 10 s, doubling per failure since the last success, capped
// at 10 minutes, counted from the last failure.
func TestBackoff(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		failures int32
		ago      time.Duration
		want     time.Duration
	}{
		{0, 0, 0}, {1, 0, 10 * time.Second}, {1, 4 * time.Second, 6 * time.Second}, {3, 0, 40 * time.Second},
		{20, 0, 10 * time.Minute}, {2, time.Minute, 0},
	} {
		if got := backoffLeft(tc.failures, now.Add(-tc.ago), now); got != tc.want {
			t.Errorf("%d failures %s ago: %s, want %s", tc.failures, tc.ago, got, tc.want)
		}
	}
}
