package job

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// noIndex is the completion index of a pod that has none (or a broken one).
const noIndex = -1

// completionIndexEnv is the variable an Indexed Job's containers find their
// index in, from the pod's label.
const completionIndexEnv = "JOB_COMPLETION_INDEX"

func indexed(job *batchv1.Job) bool {
	return job.Spec.CompletionMode != nil && *job.Spec.CompletionMode == batchv1.IndexedCompletion
}

// interval is the indexes First..Last, both included.
type interval struct{ First, Last int }

// intervals is a set of indexes as sorted, disjoint, non-adjacent
// intervals: the shape of status.completedIndexes ("1,3-5,7").
type intervals []interval

// parseIntervals reads a list such as "1,3-5,7", keeping indexes below
// completions; what it cannot read is skipped, as Kubernetes does.
func parseIntervals(s string, completions int) intervals {
	var out intervals
	if s == "" {
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		first, last, isRange := strings.Cut(part, "-")
		f, err := strconv.Atoi(first)
		if err != nil || f < 0 || f >= completions {
			continue
		}
		l := f
		if isRange {
			if l, err = strconv.Atoi(last); err != nil || l < f {
				continue
			}
			l = min(l, completions-1)
		}
		out = out.merge(intervals{{f, l}})
	}
	return out
}

// with is ivs with the indexes added.
func (ivs intervals) with(indexes ...int) intervals {
	slices.Sort(indexes)
	add := make(intervals, 0, len(indexes))
	for _, ix := range indexes {
		add = append(add, interval{ix, ix})
	}
	return ivs.merge(add)
}

// merge is the union of two interval sets.
func (ivs intervals) merge(other intervals) intervals {
	all := append(slices.Clone(ivs), other...)
	slices.SortFunc(all, func(a, b interval) int { return a.First - b.First })
	var out intervals
	for _, iv := range all {
		if n := len(out); n > 0 && iv.First <= out[n-1].Last+1 {
			out[n-1].Last = max(out[n-1].Last, iv.Last)
			continue
		}
		out = append(out, iv)
	}
	return out
}

func (ivs intervals) total() int {
	n := 0
	for _, iv := range ivs {
		n += iv.Last - iv.First + 1
	}
	return n
}

func (ivs intervals) has(ix int) bool {
	i, _ := slices.BinarySearchFunc(ivs, ix, func(iv interval, ix int) int {
		if iv.Last < ix {
			return -1
		}
		return 0
	})
	return i < len(ivs) && ivs[i].First <= ix
}

// String writes Kubernetes' form: two adjacent indexes as "3,4", three or
// more as "3-5".
func (ivs intervals) String() string {
	var b strings.Builder
	for _, iv := range ivs {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(iv.First))
		switch {
		case iv.Last == iv.First+1:
			fmt.Fprintf(&b, ",%d", iv.Last)
		case iv.Last > iv.First:
			fmt.Fprintf(&b, "-%d", iv.Last)
		}
	}
	return b.String()
}

// containsCount is how many of rule's indexes ivs holds.
func (ivs intervals) containsCount(rule intervals) int {
	n := 0
	for _, r := range rule {
		for _, iv := range ivs {
			if overlap := min(r.Last, iv.Last) - max(r.First, iv.First) + 1; overlap > 0 {
				n += overlap
			}
		}
	}
	return n
}

// completionIndex is the pod's index from its annotation.
func completionIndex(p *corev1.Pod) int {
	v, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if !ok {
		return noIndex
	}
	ix, err := strconv.Atoi(v)
	if err != nil || ix < 0 {
		return noIndex
	}
	return ix
}

// validIndex reports whether p has an index within the job's completions.
func validIndex(job *batchv1.Job, p *corev1.Pod) bool {
	ix := completionIndex(p)
	return ix != noIndex && job.Spec.Completions != nil && ix < int(*job.Spec.Completions)
}

// annotationCount reads a non-negative count annotation (0 when absent or
// broken).
func annotationCount(p *corev1.Pod, key string) int32 {
	v, err := strconv.ParseInt(p.Annotations[key], 10, 32)
	if err != nil || v < 0 {
		return 0
	}
	return int32(v)
}

// withCompletionIndex stamps a pod template with its index: annotation and
// label, the JOB_COMPLETION_INDEX variable in every container, and the
// hostname <job>-<index>, as Kubernetes' Job controller does.
func withCompletionIndex(job *batchv1.Job, template *corev1.PodTemplateSpec, ix int) {
	if template.Annotations == nil {
		template.Annotations = map[string]string{}
	}
	if template.Labels == nil {
		template.Labels = map[string]string{}
	}
	template.Annotations[batchv1.JobCompletionIndexAnnotation] = strconv.Itoa(ix)
	template.Labels[batchv1.JobCompletionIndexAnnotation] = strconv.Itoa(ix)
	template.Spec.Hostname = fmt.Sprintf("%s-%d", job.Name, ix)
	env := corev1.EnvVar{Name: completionIndexEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
		APIVersion: "v1", FieldPath: fmt.Sprintf("metadata.labels['%s']", batchv1.JobCompletionIndexAnnotation)}}}
	for _, list := range [][]corev1.Container{template.Spec.InitContainers, template.Spec.Containers} {
		for i := range list {
			if !slices.ContainsFunc(list[i].Env, func(e corev1.EnvVar) bool { return e.Name == completionIndexEnv }) {
				list[i].Env = append(list[i].Env, env)
			}
		}
	}
}

// indexedGenerateName is <job>-<index>- cut to fit generated names.
func indexedGenerateName(job string, ix int) string {
	suffix := "-" + strconv.Itoa(ix) + "-"
	const maxGenerated = 58 // 63 minus the five random characters
	if len(job)+len(suffix) > maxGenerated {
		job = job[:maxGenerated-len(suffix)]
	}
	return job + suffix
}
