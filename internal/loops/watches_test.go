package loops_test

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
)

// TestEachResourceWatchedOnce: the garbage collector takes the loops'
// informers where they watch a whole resource, as Kubernetes' collector
// takes the controller manager's, so the control plane holds one watch of
// Deployments (not the deployment loop's and the collector's); resources
// no loop watches, PodTemplates, the collector watches alone, metadata only.
func TestEachResourceWatchedOnce(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	watches := func(ctx context.Context, resource string) int {
		raw, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return -1
		}
		n := 0
		scan := bufio.NewScanner(strings.NewReader(string(raw)))
		scan.Buffer(nil, 1<<20)
		for scan.Scan() {
			line := scan.Text()
			if strings.HasPrefix(line, "apiserver_longrunning_requests{") && strings.Contains(line, `resource="`+resource+`"`) &&
				strings.Contains(line, `verb="WATCH"`) && strings.Contains(line, `subresource=""`) {
				v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				n += int(v)
			}
		}
		return n
	}
	for resource, want := range map[string]int{"deployments": 1, "replicasets": 1, "jobs": 1, "podtemplates": 1} {
		c.Eventually(resource+" watched once", 20*time.Second, func(ctx context.Context) (bool, error) {
			return watches(ctx, resource) == want, nil
		})
	}
}
