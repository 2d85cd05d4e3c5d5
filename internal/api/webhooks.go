package api

import (
	"context"
	"strconv"

	"github.com/orch-dev/orch/internal/api/admission/policy"
	"github.com/orch-dev/orch/internal/api/admission/webhook"
	"github.com/orch-dev/orch/internal/api/rest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
)

// newWebhooks makes the dispatcher of the cluster's admission webhooks,
// reaching Services' endpoints directly, without the node's proxy.
func (s *Server) newWebhooks() *webhook.Dispatcher {
	return webhook.New(webhookServices{s}, func(ctx context.Context, name string) (map[string]string, error) {
		obj, err := s.storage("", "namespaces").Get(ctx, "", name)
		if err != nil {
			return nil, err
		}
		return obj.(*corev1.Namespace).Labels, nil
	}, policy.Conditions{Authz: s.authz}, s.log.With("component", "admission-webhooks"))
}

// followWebhooks keeps the dispatcher's configurations current until ctx
// ends.
func (s *Server) followWebhooks(ctx context.Context) {
	go follow(ctx, s.storage(admissionregistrationv1.GroupName, "mutatingwebhookconfigurations"), s.webhooks.Mutating(), s.log)
	go follow(ctx, s.storage(admissionregistrationv1.GroupName, "validatingwebhookconfigurations"), s.webhooks.Validating(), s.log)
}

// webhookServices resolves a webhook's Service to a ready endpoint.
type webhookServices struct{ s *Server }

func (w webhookServices) ResolveService(ctx context.Context, namespace, name string, port int32) (string, error) {
	return rest.ServiceEndpoint(ctx, w.s.storage("", "services"), w.s.storage("discovery.k8s.io", "endpointslices"), namespace, name, strconv.Itoa(int(port)))
}
