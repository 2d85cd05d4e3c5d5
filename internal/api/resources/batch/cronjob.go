package batch

import (
	"strings"
	"time"
	// Time zones are built in: a CronJob's timeZone must mean the same on
	// a board whose OS has no zoneinfo, as kube-controller-manager embeds
	// them.
	_ "time/tzdata"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func cronJobs() *resources.Resource {
	return resources.Described[batchv1.CronJob, batchv1.CronJobList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("batch", "CronJob"), Plural: "cronjobs", Singular: "cronjob", Namespaced: true,
		ShortNames: []string{"cj"}, Categories: []string{"all"}, Subresources: []resources.Subresource{resources.Status()}, StorageKey: "cronjobs",
		HasSpec: true, Default: resources.Typed(defaultCronJob),
		Validate:         resources.TypedValidate(validateCronJob),
		PrepareForCreate: resources.Typed(func(cj *batchv1.CronJob) { cj.Status = batchv1.CronJobStatus{} }),
		Columns:          cronJobColumns, Row: resources.TypedRow(cronJobRow),
	})
}

func defaultCronJob(cj *batchv1.CronJob) {
	spec := &cj.Spec
	if spec.ConcurrencyPolicy == "" {
		spec.ConcurrencyPolicy = batchv1.AllowConcurrent
	}
	if spec.Suspend == nil {
		spec.Suspend = ptr.To(false)
	}
	if spec.SuccessfulJobsHistoryLimit == nil {
		spec.SuccessfulJobsHistoryLimit = ptr.To[int32](3)
	}
	if spec.FailedJobsHistoryLimit == nil {
		spec.FailedJobsHistoryLimit = ptr.To[int32](1)
	}
	// Only the pod template is defaulted: a job template's counts stay
	// unset until a Job is made from it, as in Kubernetes.
	core.DefaultPodTemplate(&spec.JobTemplate.Spec.Template)
}

// cronJobNameMax leaves room for the 11 characters ("-" and the minutes
// since the epoch) the name of each Job made from the CronJob adds.
const cronJobNameMax = 52

func validateCronJob(cj *batchv1.CronJob) field.ErrorList {
	var errs field.ErrorList
	if len(cj.Name) > cronJobNameMax {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), cj.Name, "must be no more than 52 characters"))
	}
	spec, path := &cj.Spec, resources.SpecPath
	errs = append(errs, ValidateSchedule(spec.Schedule, path.Child("schedule"))...)
	// orch never stored a schedule with a TZ, so none needs keeping on
	// update (Kubernetes keeps those stored before it forbade them).
	if strings.Contains(spec.Schedule, "TZ") {
		errs = append(errs, field.Invalid(path.Child("schedule"), spec.Schedule, "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"))
	}
	if _, err := TimeZone(spec.TimeZone); err != nil {
		errs = append(errs, field.Invalid(path.Child("timeZone"), *spec.TimeZone, err.Error()))
	}
	switch spec.ConcurrencyPolicy {
	case batchv1.AllowConcurrent, batchv1.ForbidConcurrent, batchv1.ReplaceConcurrent:
	case "":
		errs = append(errs, field.Required(path.Child("concurrencyPolicy"), ""))
	default:
		errs = append(errs, field.NotSupported(path.Child("concurrencyPolicy"), spec.ConcurrencyPolicy,
			[]string{string(batchv1.AllowConcurrent), string(batchv1.ForbidConcurrent), string(batchv1.ReplaceConcurrent)}))
	}
	if spec.StartingDeadlineSeconds != nil && *spec.StartingDeadlineSeconds < 0 {
		errs = append(errs, field.Invalid(path.Child("startingDeadlineSeconds"), *spec.StartingDeadlineSeconds, "must be greater than or equal to 0"))
	}
	errs = append(errs, resources.ValidateReplicas(spec.SuccessfulJobsHistoryLimit, path.Child("successfulJobsHistoryLimit"))...)
	errs = append(errs, resources.ValidateReplicas(spec.FailedJobsHistoryLimit, path.Child("failedJobsHistoryLimit"))...)
	tmpl := path.Child("jobTemplate", "spec")
	errs = append(errs, core.ValidatePodTemplateSpec(&spec.JobTemplate.Spec.Template, tmpl.Child("template"))...)
	return append(errs, validateJobSpec(&spec.JobTemplate.Spec, tmpl)...)
}

// ValidateSchedule checks a standard cron schedule (five fields, or a
// macro such as @hourly) as Kubernetes does, with robfig/cron's message.
func ValidateSchedule(schedule string, path *field.Path) field.ErrorList {
	if schedule == "" {
		return field.ErrorList{field.Required(path, "")}
	}
	if _, err := cron.ParseStandard(schedule); err != nil {
		return field.ErrorList{field.Invalid(path, schedule, err.Error())}
	}
	return nil
}

// TimeZone is the location a CronJob's schedule is read in: UTC when
// timeZone is unset, else the IANA zone it names ("Local" is refused:
// the server's own zone would make the schedule depend on the machine).
func TimeZone(tz *string) (*time.Location, error) {
	switch {
	case tz == nil:
		return time.UTC, nil
	case *tz == "":
		return nil, errString("timeZone must be nil or non-empty string")
	case strings.EqualFold(*tz, "Local"):
		return nil, errString("timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones")
	}
	return time.LoadLocation(*tz)
}

type errString string

func (e errString) Error() string { return string(e) }

var cronJobColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Schedule", "string", 0, batchv1.CronJobSpec{}.SwaggerDoc()["schedule"]),
	resources.Col("Timezone", "string", 0, batchv1.CronJobSpec{}.SwaggerDoc()["timeZone"]),
	resources.Col("Suspend", "boolean", 0, batchv1.CronJobSpec{}.SwaggerDoc()["suspend"]),
	resources.Col("Active", "integer", 0, batchv1.CronJobStatus{}.SwaggerDoc()["active"]),
	resources.Col("Last Schedule", "string", 0, batchv1.CronJobStatus{}.SwaggerDoc()["lastScheduleTime"]),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
	resources.Col("Selector", "string", 1, batchv1.JobSpec{}.SwaggerDoc()["selector"]),
}

func cronJobRow(cj *batchv1.CronJob) []any {
	last := "<none>"
	if cj.Status.LastScheduleTime != nil {
		last = resources.Age(*cj.Status.LastScheduleTime)
	}
	names, images := core.ContainersAndImages(&cj.Spec.JobTemplate.Spec.Template.Spec)
	suspend := "<unset>"
	if cj.Spec.Suspend != nil {
		suspend = map[bool]string{true: "True", false: "False"}[*cj.Spec.Suspend]
	}
	return []any{cj.Name, cj.Spec.Schedule, resources.OrNone(ptr.Deref(cj.Spec.TimeZone, "")), suspend,
		int64(len(cj.Status.Active)), last, resources.Age(cj.CreationTimestamp), names, images,
		resources.SelectorString(cj.Spec.JobTemplate.Spec.Selector)}
}
