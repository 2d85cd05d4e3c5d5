// Package batch describes the kinds of the batch API group (batch/v1).
package batch

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Resources describes the batch group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{jobs(), cronJobs()} }

func jobs() *resources.Resource {
	return resources.Described[batchv1.Job, batchv1.JobList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("batch", "Job"), Plural: "jobs", Singular: "job", Namespaced: true, OrphanByDefault: true,
		Categories: []string{"all"}, Subresources: []resources.Subresource{resources.Status()}, StorageKey: "jobs",
		HasSpec: true, Default: resources.Typed(defaultJob), Validate: resources.TypedValidate(validateJob),
		ValidateUpdate: resources.TypedValidateUpdate(func(job, old *batchv1.Job) field.ErrorList {
			errs := resources.Immutable(job.Spec.Selector, old.Spec.Selector, resources.SpecPath.Child("selector"))
			// An Indexed Job scales by changing completions and parallelism
			// together (Kubernetes' elastic Indexed Jobs).
			elastic := indexedJob(job) && job.Spec.Completions != nil && ptr.Equal(job.Spec.Completions, job.Spec.Parallelism)
			if !elastic {
				errs = append(errs, resources.Immutable(job.Spec.Completions, old.Spec.Completions, resources.SpecPath.Child("completions"))...)
			}
			errs = append(errs, resources.Immutable(job.Spec.CompletionMode, old.Spec.CompletionMode, resources.SpecPath.Child("completionMode"))...)
			errs = append(errs, resources.Immutable(job.Spec.ManagedBy, old.Spec.ManagedBy, resources.SpecPath.Child("managedBy"))...)
			return append(errs, resources.Immutable(job.Spec.Template, old.Spec.Template, resources.SpecPath.Child("template"))...)
		}),
		PrepareForCreate: resources.Typed(func(job *batchv1.Job) { job.Status = batchv1.JobStatus{} }),
		Fields: resources.TypedFields(func(job *batchv1.Job) fields.Set {
			return fields.Set{"status.successful": strconv.Itoa(int(job.Status.Succeeded))}
		}),
		Columns: jobColumns, Row: resources.TypedRow(jobRow),
	})
}

func defaultJob(job *batchv1.Job) {
	spec := &job.Spec
	if spec.Completions == nil && spec.Parallelism == nil {
		spec.Completions = ptr.To[int32](1)
		spec.Parallelism = ptr.To[int32](1)
	}
	if spec.Parallelism == nil {
		spec.Parallelism = ptr.To[int32](1)
	}
	if spec.BackoffLimit == nil {
		if spec.BackoffLimitPerIndex != nil {
			// Per-index limits only, unless the user sets both.
			spec.BackoffLimit = ptr.To[int32](math.MaxInt32)
		} else {
			spec.BackoffLimit = ptr.To[int32](6)
		}
	}
	if spec.CompletionMode == nil {
		spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	}
	if spec.Suspend == nil {
		spec.Suspend = ptr.To(false)
	}
	if spec.PodReplacementPolicy == nil {
		// A pod failure policy judges pods once they have failed, so their
		// replacements wait for that.
		spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
		if spec.PodFailurePolicy != nil {
			spec.PodReplacementPolicy = ptr.To(batchv1.Failed)
		}
	}
	if spec.PodFailurePolicy != nil {
		for i := range spec.PodFailurePolicy.Rules {
			for j := range spec.PodFailurePolicy.Rules[i].OnPodConditions {
				if c := &spec.PodFailurePolicy.Rules[i].OnPodConditions[j]; c.Status == "" {
					c.Status = corev1.ConditionTrue
				}
			}
		}
	}
	if spec.ManualSelector == nil || !*spec.ManualSelector {
		// The Job gets a selector on its own uid, as Kubernetes' job strategy
		// does; the uid is set by the registry before defaults run.
		uid := string(job.UID)
		labels := map[string]string{batchv1.ControllerUidLabel: uid, batchv1.JobNameLabel: job.Name,
			"controller-uid": uid, "job-name": job.Name}
		if spec.Selector == nil {
			spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.ControllerUidLabel: uid}}
		}
		if spec.Template.Labels == nil {
			spec.Template.Labels = map[string]string{}
		}
		for k, v := range labels {
			if _, ok := spec.Template.Labels[k]; !ok {
				spec.Template.Labels[k] = v
			}
		}
	}
	core.DefaultPodTemplate(&spec.Template)
}

func indexedJob(job *batchv1.Job) bool {
	return ptr.Deref(job.Spec.CompletionMode, "") == batchv1.IndexedCompletion
}

func validateJob(job *batchv1.Job) field.ErrorList {
	errs := core.ValidatePodTemplate(job.Spec.Selector, &job.Spec.Template, resources.SpecPath)
	return append(errs, validateJobSpec(&job.Spec, resources.SpecPath)...)
}

// validateJobSpec checks what a Job and a CronJob's job template share:
// counts, the template's restart policy, the completion mode and the
// failure and success policies, as Kubernetes' Job validation does.
func validateJobSpec(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	errs := resources.ValidateReplicas(spec.Parallelism, path.Child("parallelism"))
	errs = append(errs, resources.ValidateReplicas(spec.Completions, path.Child("completions"))...)
	errs = append(errs, resources.ValidateReplicas(spec.BackoffLimit, path.Child("backoffLimit"))...)
	errs = append(errs, resources.ValidateReplicas(spec.BackoffLimitPerIndex, path.Child("backoffLimitPerIndex"))...)
	errs = append(errs, resources.ValidateReplicas(spec.MaxFailedIndexes, path.Child("maxFailedIndexes"))...)
	if d := spec.ActiveDeadlineSeconds; d != nil && *d <= 0 {
		errs = append(errs, field.Invalid(path.Child("activeDeadlineSeconds"), *d, "must be greater than 0"))
	}
	if p := spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyOnFailure && p != corev1.RestartPolicyNever {
		errs = append(errs, field.NotSupported(path.Child("template", "spec", "restartPolicy"), p,
			[]string{string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	}
	indexed := false
	if m := spec.CompletionMode; m != nil {
		switch *m {
		case batchv1.IndexedCompletion:
			indexed = true
		case batchv1.NonIndexedCompletion:
		default:
			errs = append(errs, field.NotSupported(path.Child("completionMode"), *m, []string{string(batchv1.NonIndexedCompletion), string(batchv1.IndexedCompletion)}))
		}
	}
	const maxIndexed = 100000
	if indexed {
		switch {
		case spec.Completions == nil:
			errs = append(errs, field.Required(path.Child("completions"), fmt.Sprintf("when completion mode is %s", batchv1.IndexedCompletion)))
		case *spec.Completions > maxIndexed:
			errs = append(errs, field.Invalid(path.Child("completions"), *spec.Completions, fmt.Sprintf("must be less than or equal to %d when completion mode is %s", maxIndexed, batchv1.IndexedCompletion)))
		}
		if spec.Parallelism != nil && *spec.Parallelism > maxIndexed {
			errs = append(errs, field.Invalid(path.Child("parallelism"), *spec.Parallelism, fmt.Sprintf("must be less than or equal to %d when completion mode is %s", maxIndexed, batchv1.IndexedCompletion)))
		}
	}
	if spec.BackoffLimitPerIndex != nil && !indexed {
		errs = append(errs, field.Forbidden(path.Child("backoffLimitPerIndex"), "requires indexed completion mode"))
	}
	if m := spec.MaxFailedIndexes; m != nil {
		switch {
		case spec.BackoffLimitPerIndex == nil:
			errs = append(errs, field.Required(path.Child("backoffLimitPerIndex"), "when maxFailedIndexes is specified"))
		case spec.Completions != nil && *m > *spec.Completions:
			errs = append(errs, field.Invalid(path.Child("maxFailedIndexes"), *m, "must be less than or equal to completions"))
		}
	}
	errs = append(errs, validatePodFailurePolicy(spec, path)...)
	if sp := spec.SuccessPolicy; sp != nil {
		sPath := path.Child("successPolicy")
		if !indexed {
			errs = append(errs, field.Invalid(path.Child("completionMode"), ptr.Deref(spec.CompletionMode, ""), "requires indexed completion mode"))
		}
		if len(sp.Rules) == 0 || len(sp.Rules) > 20 {
			errs = append(errs, field.Invalid(sPath.Child("rules"), len(sp.Rules), "must have between 1 and 20 rules"))
		}
		for i, r := range sp.Rules {
			rPath := sPath.Child("rules").Index(i)
			if r.SucceededIndexes == nil && r.SucceededCount == nil {
				errs = append(errs, field.Required(rPath, "at least one of succeededCount or succeededIndexes must be specified"))
			}
			if r.SucceededIndexes != nil {
				errs = append(errs, validateIndexes(*r.SucceededIndexes, spec.Completions, rPath.Child("succeededIndexes"))...)
			}
			if c := r.SucceededCount; c != nil && (*c < 0 || spec.Completions != nil && *c > *spec.Completions) {
				errs = append(errs, field.Invalid(rPath.Child("succeededCount"), *c, "must be between 0 and completions"))
			}
		}
	}
	if p := spec.PodReplacementPolicy; p != nil {
		switch {
		case *p != batchv1.Failed && *p != batchv1.TerminatingOrFailed:
			errs = append(errs, field.NotSupported(path.Child("podReplacementPolicy"), *p, []string{string(batchv1.TerminatingOrFailed), string(batchv1.Failed)}))
		case *p == batchv1.TerminatingOrFailed && spec.PodFailurePolicy != nil:
			errs = append(errs, field.NotSupported(path.Child("podReplacementPolicy"), *p, []string{string(batchv1.Failed)}))
		}
	}
	return errs
}

// validatePodFailurePolicy: at most 20 rules, each with one requirement;
// exit codes sorted, unique, and never 0 with In; FailIndex only with
// backoffLimitPerIndex; only for restartPolicy Never.
func validatePodFailurePolicy(spec *batchv1.JobSpec, specPath *field.Path) field.ErrorList {
	pfp := spec.PodFailurePolicy
	if pfp == nil {
		return nil
	}
	path := specPath.Child("podFailurePolicy")
	var errs field.ErrorList
	if spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		errs = append(errs, field.Invalid(specPath.Child("template", "spec", "restartPolicy"), spec.Template.Spec.RestartPolicy,
			"only \"Never\" is supported when podFailurePolicy is specified"))
	}
	if len(pfp.Rules) > 20 {
		errs = append(errs, field.TooMany(path.Child("rules"), len(pfp.Rules), 20))
	}
	actions := []string{string(batchv1.PodFailurePolicyActionFailJob), string(batchv1.PodFailurePolicyActionFailIndex),
		string(batchv1.PodFailurePolicyActionIgnore), string(batchv1.PodFailurePolicyActionCount)}
	for i, r := range pfp.Rules {
		rPath := path.Child("rules").Index(i)
		switch r.Action {
		case batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyActionIgnore, batchv1.PodFailurePolicyActionCount:
		case batchv1.PodFailurePolicyActionFailIndex:
			if spec.BackoffLimitPerIndex == nil {
				errs = append(errs, field.Invalid(rPath.Child("action"), r.Action, "requires the backoffLimitPerIndex to be set"))
			}
		default:
			errs = append(errs, field.NotSupported(rPath.Child("action"), r.Action, actions))
		}
		switch {
		case r.OnExitCodes != nil && len(r.OnPodConditions) > 0:
			errs = append(errs, field.Invalid(rPath, field.OmitValueType{}, "specifying both OnExitCodes and OnPodConditions is not supported"))
		case r.OnExitCodes == nil && len(r.OnPodConditions) == 0:
			errs = append(errs, field.Invalid(rPath, field.OmitValueType{}, "specifying one of OnExitCodes and OnPodConditions is required"))
		}
		if oc := r.OnExitCodes; oc != nil {
			ocPath := rPath.Child("onExitCodes")
			if oc.Operator != batchv1.PodFailurePolicyOnExitCodesOpIn && oc.Operator != batchv1.PodFailurePolicyOnExitCodesOpNotIn {
				errs = append(errs, field.NotSupported(ocPath.Child("operator"), oc.Operator, []string{string(batchv1.PodFailurePolicyOnExitCodesOpIn), string(batchv1.PodFailurePolicyOnExitCodesOpNotIn)}))
			}
			if len(oc.Values) == 0 || len(oc.Values) > 255 {
				errs = append(errs, field.Invalid(ocPath.Child("values"), len(oc.Values), "must have between 1 and 255 values"))
			}
			for j, v := range oc.Values {
				switch {
				case oc.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn && v == 0:
					errs = append(errs, field.Invalid(ocPath.Child("values").Index(j), v, "must not be 0 for the In operator"))
				case j > 0 && oc.Values[j-1] == v:
					errs = append(errs, field.Duplicate(ocPath.Child("values").Index(j), v))
				case j > 0 && oc.Values[j-1] > v:
					errs = append(errs, field.Invalid(ocPath.Child("values").Index(j), v, "must be ordered"))
				}
			}
		}
		for j, c := range r.OnPodConditions {
			cPath := rPath.Child("onPodConditions").Index(j)
			if c.Type == "" {
				errs = append(errs, field.Required(cPath.Child("type"), ""))
			}
			if c.Status != corev1.ConditionTrue && c.Status != corev1.ConditionFalse && c.Status != corev1.ConditionUnknown {
				errs = append(errs, field.NotSupported(cPath.Child("status"), c.Status, []string{string(corev1.ConditionTrue), string(corev1.ConditionFalse), string(corev1.ConditionUnknown)}))
			}
		}
	}
	return errs
}

// validateIndexes checks a list of indexes as "1,3-5,7": ascending,
// non-overlapping intervals below completions.
func validateIndexes(s string, completions *int32, path *field.Path) field.ErrorList {
	last := -1
	for _, part := range strings.Split(s, ",") {
		first, end, isRange := strings.Cut(part, "-")
		f, err := strconv.Atoi(first)
		l := f
		if err == nil && isRange {
			l, err = strconv.Atoi(end)
		}
		switch {
		case err != nil || f < 0 || l < f:
			return field.ErrorList{field.Invalid(path, s, fmt.Sprintf("error parsing %q: must be an index or a range of them", part))}
		case f <= last:
			return field.ErrorList{field.Invalid(path, s, "must be ordered and non-overlapping intervals")}
		case completions != nil && l >= int(*completions):
			return field.ErrorList{field.Invalid(path, s, fmt.Sprintf("must be less than completions (%d)", *completions))}
		}
		last = l
	}
	return nil
}

var jobColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Status", "string", 0, "Status of the job."),
	resources.Col("Completions", "string", 0, batchv1.JobStatus{}.SwaggerDoc()["succeeded"]),
	resources.Col("Duration", "string", 0, "Time required to complete the job."),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
	resources.Col("Selector", "string", 1, batchv1.JobSpec{}.SwaggerDoc()["selector"]),
}

func jobRow(job *batchv1.Job) []any {
	completions := fmt.Sprintf("%d/1 of %d", job.Status.Succeeded, resources.PtrOr(job.Spec.Parallelism, 1))
	if job.Spec.Completions != nil {
		completions = fmt.Sprintf("%d/%d", job.Status.Succeeded, *job.Spec.Completions)
	}
	status := "Running"
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			status = "Complete"
		case batchv1.JobFailed:
			status = "Failed"
		case batchv1.JobSuspended:
			status = "Suspended"
		case batchv1.JobFailureTarget:
			status = "FailureTarget"
		case batchv1.JobSuccessCriteriaMet:
			status = "SuccessCriteriaMet"
		}
	}
	if job.DeletionTimestamp != nil {
		status = "Terminating"
	}
	dur := ""
	if job.Status.StartTime != nil {
		end := time.Now()
		if job.Status.CompletionTime != nil {
			end = job.Status.CompletionTime.Time
		}
		dur = duration.HumanDuration(end.Sub(job.Status.StartTime.Time))
	}
	names, images := core.ContainersAndImages(&job.Spec.Template.Spec)
	return []any{job.Name, status, completions, dur, resources.Age(job.CreationTimestamp), names, images, resources.SelectorString(job.Spec.Selector)}
}
