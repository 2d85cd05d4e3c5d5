package job

import (
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// failureVerdict is what a Job's podFailurePolicy makes of one failed pod.
type failureVerdict struct {
	// action is the matching rule's, empty when no rule matched.
	action batchv1.PodFailurePolicyAction
	// failJob is the Job's failure message when a FailJob rule matched.
	failJob string
}

// counts reports whether the failure counts against backoffLimit (and
// backoffLimitPerIndex): all but an Ignore rule's do.
func (v failureVerdict) counts() bool { return v.action != batchv1.PodFailurePolicyActionIgnore }

// judgeFailure applies the Job's pod failure policy to a failed pod: the
// first rule that matches decides, as on Kubernetes.
func judgeFailure(job *batchv1.Job, p *corev1.Pod) failureVerdict {
	policy := job.Spec.PodFailurePolicy
	if policy == nil {
		return failureVerdict{}
	}
	for i, rule := range policy.Rules {
		var what string
		switch {
		case rule.OnExitCodes != nil:
			cs := matchExitCodes(p, rule.OnExitCodes)
			if cs == nil {
				continue
			}
			what = fmt.Sprintf("Container %s for pod %s/%s failed with exit code %d", cs.Name, p.Namespace, p.Name, cs.State.Terminated.ExitCode)
		case len(rule.OnPodConditions) > 0:
			cond := matchConditions(p, rule.OnPodConditions)
			if cond == nil {
				continue
			}
			what = fmt.Sprintf("Pod %s/%s has condition %s", p.Namespace, p.Name, cond.Type)
		default:
			continue
		}
		v := failureVerdict{action: rule.Action}
		if rule.Action == batchv1.PodFailurePolicyActionFailJob {
			v.failJob = fmt.Sprintf("%s matching %s rule at index %d", what, rule.Action, i)
		}
		return v
	}
	return failureVerdict{}
}

// matchExitCodes is the first terminated container (then init container)
// whose non-zero exit code the requirement matches.
func matchExitCodes(p *corev1.Pod, req *batchv1.PodFailurePolicyOnExitCodesRequirement) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			cs := &list[i]
			t := cs.State.Terminated
			if t == nil || t.ExitCode == 0 || req.ContainerName != nil && *req.ContainerName != cs.Name {
				continue
			}
			in := slices.Contains(req.Values, t.ExitCode)
			if req.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn && in || req.Operator == batchv1.PodFailurePolicyOnExitCodesOpNotIn && !in {
				return cs
			}
		}
	}
	return nil
}

func matchConditions(p *corev1.Pod, patterns []batchv1.PodFailurePolicyOnPodConditionsPattern) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		c := &p.Status.Conditions[i]
		for _, want := range patterns {
			if c.Type == want.Type && c.Status == want.Status {
				return c
			}
		}
	}
	return nil
}

// matchSuccessPolicy reports the first successPolicy rule the succeeded
// indexes meet, with Kubernetes' message.
func matchSuccessPolicy(job *batchv1.Job, succeeded intervals) (string, bool) {
	policy := job.Spec.SuccessPolicy
	if policy == nil || len(succeeded) == 0 || job.Spec.Completions == nil {
		return "", false
	}
	for i, rule := range policy.Rules {
		met := false
		switch {
		case rule.SucceededIndexes != nil:
			want := parseIntervals(*rule.SucceededIndexes, int(*job.Spec.Completions))
			if len(want) == 0 {
				continue
			}
			have := succeeded.containsCount(want)
			met = have == want.total() || rule.SucceededCount != nil && have >= int(*rule.SucceededCount)
		case rule.SucceededCount != nil:
			met = succeeded.total() >= int(*rule.SucceededCount)
		}
		if met {
			return fmt.Sprintf("Matched rules at index %d", i), true
		}
	}
	return "", false
}
