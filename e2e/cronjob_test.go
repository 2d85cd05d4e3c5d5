//go:build e2e

package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCronJobOnARealNode: `kubectl create cronjob` every minute on a real
// node: within the minute after its time a Job's pod runs the command
// (its output read back with kubectl logs), the Job completes and the
// CronJob says when it last succeeded.
func TestCronJobOnARealNode(t *testing.T) {
	c := newCluster(t)
	c.addNode("node-a", "198.18.0.51")
	c.mustKubectl("", "create", "cronjob", "tick", "--image=busybox:test", "--schedule=* * * * *", "--", "sh", "-c", "echo tick from $(hostname)")
	ctx := context.Background()
	var job string
	deadline := time.Now().Add(150 * time.Second)
	agenttest.EventuallyWithin(t, "a Job of the CronJob complete", time.Until(deadline), func() bool {
		cj, err := c.client.BatchV1().CronJobs("default").Get(ctx, "tick", metav1.GetOptions{})
		if err != nil || cj.Status.LastSuccessfulTime == nil {
			return false
		}
		jobs, err := c.client.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
		for _, j := range jobs.Items {
			for _, cond := range j.Status.Conditions {
				if err == nil && cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue {
					job = j.Name
				}
			}
		}
		return job != ""
	})
	if out := c.mustKubectl("", "logs", "job/"+job); !strings.Contains(out, "tick from "+job) {
		t.Errorf("kubectl logs job/%s: %q", job, out)
	}
}
