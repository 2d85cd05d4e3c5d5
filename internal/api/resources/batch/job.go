// Package batch describes the kinds of the batch API group (batch/v1).
package batch

import (
	"fmt"
	"strconv"
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
		GroupVersionKind: resources.GVK("batch", "Job"), Plural: "jobs", Singular: "job", Namespaced: true, OrphanByDefault: true,
		Categories: []string{"all"}, Subresources: []resources.Subresource{resources.Status()}, StorageKey: "jobs",
		HasSpec: true, Default: resources.Typed(defaultJob), Validate: resources.TypedValidate(validateJob),
		ValidateUpdate: resources.TypedValidateUpdate(func(job, old *batchv1.Job) field.ErrorList {
			errs := resources.Immutable(job.Spec.Selector, old.Spec.Selector, resources.SpecPath.Child("selector"))
			errs = append(errs, resources.Immutable(job.Spec.Completions, old.Spec.Completions, resources.SpecPath.Child("completions"))...)
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
		spec.BackoffLimit = ptr.To[int32](6)
	}
	if spec.CompletionMode == nil {
		spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	}
	if spec.Suspend == nil {
		spec.Suspend = ptr.To(false)
	}
	if spec.PodReplacementPolicy == nil {
		spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
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

func validateJob(job *batchv1.Job) field.ErrorList {
	errs := core.ValidatePodTemplate(job.Spec.Selector, &job.Spec.Template, resources.SpecPath)
	return append(errs, validateJobSpec(&job.Spec, resources.SpecPath)...)
}

// validateJobSpec checks what a Job and a CronJob's job template share:
// counts and the template's restart policy.
func validateJobSpec(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	errs := resources.ValidateReplicas(spec.Parallelism, path.Child("parallelism"))
	errs = append(errs, resources.ValidateReplicas(spec.Completions, path.Child("completions"))...)
	errs = append(errs, resources.ValidateReplicas(spec.BackoffLimit, path.Child("backoffLimit"))...)
	if p := spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyOnFailure && p != corev1.RestartPolicyNever {
		errs = append(errs, field.NotSupported(path.Child("template", "spec", "restartPolicy"), p,
			[]string{string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	}
	return errs
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
