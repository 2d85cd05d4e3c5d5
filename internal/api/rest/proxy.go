package rest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/registry"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilproxy "k8s.io/apimachinery/pkg/util/proxy"
)

// newProxyTransport reaches pods for pods/proxy and services/proxy
// through dial (nil: directly); an https pod's certificate is not
// checked, as kube-apiserver's proxy does not.
func newProxyTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second}).DialContext
	}
	return &http.Transport{Proxy: nil, DialContext: dial, ForceAttemptHTTP2: false, IdleConnTimeout: 90 * time.Second,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // Kubernetes' proxy does not verify pods
}

// proxy serves pods/NAME[:PORT]/proxy/PATH and services/NAME[:PORT]/proxy/PATH
// as kube-apiserver does: the request, any method, passed to the pod's
// address (a Service's: one ready endpoint's) and the answer passed back.
// The name may be [scheme:]name[:port], the port a number or a name.
// The API server reaches pods over the pod network, as on Kubernetes.
func (q *request) proxy() error {
	scheme, name, port := splitProxyName(q.info.Name)
	var host string
	var err error
	switch q.info.Resource {
	case "pods":
		host, err = q.podProxyHost(name, port)
	case "services":
		host, err = q.serviceProxyHost(name, port)
	default:
		return apierrors.NewNotFound(schema.GroupResource{Resource: q.info.Resource + "/proxy"}, q.info.Name)
	}
	if err != nil {
		return err
	}
	// .../proxy without a trailing slash is moved to .../proxy/ for GET and
	// HEAD, as kube-apiserver's proxy does, so that the pod's relative
	// links resolve under the proxy.
	if q.info.SubPath == "" && !strings.HasSuffix(q.r.URL.Path, "/") && (q.r.Method == http.MethodGet || q.r.Method == http.MethodHead) {
		location := q.r.URL.Path + "/"
		if q.r.URL.RawQuery != "" {
			location += "?" + q.r.URL.RawQuery
		}
		q.w.Header().Set("Location", location)
		q.w.WriteHeader(http.StatusMovedPermanently)
		return nil
	}
	target := &url.URL{Scheme: scheme, Host: host, Path: q.info.SubPath, RawQuery: q.r.URL.RawQuery}
	if target.Path == "" || strings.HasSuffix(q.r.URL.Path, "/") && !strings.HasSuffix(target.Path, "/") {
		target.Path += "/" // kept, as Kubernetes keeps it
	}
	// Links in an HTML answer are rewritten to go through the proxy, and
	// CORS headers dropped, as kube-apiserver's proxy does: the request's
	// path up to the pod's own is put before the pod's absolute links.
	rewriting := &utilproxy.Transport{Scheme: q.r.URL.Scheme, Host: q.r.URL.Host, PathPrepend: strings.TrimSuffix(q.r.URL.Path, target.Path),
		RoundTripper: q.h.proxyTransport}
	rp := &httputil.ReverseProxy{Transport: corsRemoving{rewriting},
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = target
			pr.Out.Host = host
			pr.Out.Header.Del("Authorization")
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			q.h.writeError(w, r, apierrors.NewServiceUnavailable(fmt.Sprintf("error trying to reach %s: %v", q.info.Resource, err)))
		},
	}
	rp.ServeHTTP(q.w, q.r)
	return nil
}

// corsRemoving drops a proxied answer's CORS headers: the API server's
// own CORS policy applies, not the pod's.
type corsRemoving struct{ http.RoundTripper }

func (t corsRemoving) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(req)
	if resp != nil {
		for name := range resp.Header {
			if strings.HasPrefix(http.CanonicalHeaderKey(name), "Access-Control-") {
				resp.Header.Del(name)
			}
		}
	}
	return resp, err
}

// splitProxyName reads [scheme:]name[:port].
func splitProxyName(s string) (scheme, name, port string) {
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 1:
		return "http", parts[0], ""
	case 2:
		return "http", parts[0], parts[1]
	default:
		scheme = parts[0]
		if scheme != "https" {
			scheme = "http"
		}
		return scheme, parts[1], parts[2]
	}
}

// podProxyHost is the address of a pod and one of its ports, by number or
// by a container port's name, the first one it declares when none is
// named.
func (q *request) podProxyHost(name, port string) (string, error) {
	obj, err := q.st.Get(q.ctx(), q.namespace, name)
	if err != nil {
		return "", err
	}
	pod := obj.(*corev1.Pod)
	if pod.Status.PodIP == "" {
		return "", apierrors.NewServiceUnavailable(fmt.Sprintf("pod %s has no address yet", pod.Name))
	}
	if port == "" {
		// Kubernetes' rule: the first port a container declares, else
		// the scheme's own.
		for _, c := range pod.Spec.Containers {
			if len(c.Ports) > 0 {
				port = strconv.Itoa(int(c.Ports[0].ContainerPort))
				break
			}
		}
	}
	if port == "" {
		return pod.Status.PodIP, nil
	}
	if _, err := strconv.Atoi(port); err != nil {
		found := false
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				if p.Name == port {
					port, found = strconv.Itoa(int(p.ContainerPort)), true
				}
			}
		}
		if !found {
			return "", apierrors.NewBadRequest(fmt.Sprintf("pod %s has no port named %q", pod.Name, port))
		}
	}
	return net.JoinHostPort(pod.Status.PodIP, port), nil
}

// serviceProxyHost is a ready endpoint of the Service's port (by number or
// name; the only port when none is given).
func (q *request) serviceProxyHost(name, port string) (string, error) {
	return ServiceEndpoint(q.ctx(), q.st, q.served.Storage(discoveryv1.SchemeGroupVersion.WithResource("endpointslices")), q.namespace, name, port)
}

// ServiceEndpoint is the address (host:port) of a ready endpoint of a
// Service's port, by number or name (the only port when port is ""), read
// from its EndpointSlices: how the API server reaches a Service without
// the node's proxy (services/proxy, admission webhooks).
func ServiceEndpoint(ctx context.Context, services, endpointSlices *registry.Storage, namespace, name, port string) (string, error) {
	obj, err := services.Get(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	svc := obj.(*corev1.Service)
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if port == "" && len(svc.Spec.Ports) == 1 || port == p.Name || port == strconv.Itoa(int(p.Port)) {
			sp = p
		}
	}
	if sp == nil {
		return "", apierrors.NewServiceUnavailable(fmt.Sprintf("no service port %q found for service %q", port, svc.Name))
	}
	if endpointSlices == nil {
		return "", apierrors.NewServiceUnavailable("endpointslices are not served")
	}
	list, err := endpointSlices.List(ctx, namespace, &metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return "", err
	}
	for _, s := range list.(*discoveryv1.EndpointSliceList).Items {
		target := int32(0)
		for _, p := range s.Ports {
			if p.Port != nil && (p.Name == nil && sp.Name == "" || p.Name != nil && *p.Name == sp.Name) {
				target = *p.Port
			}
		}
		if target == 0 && sp.TargetPort.Type == intstr.Int {
			target = sp.TargetPort.IntVal
		}
		if target == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if (e.Conditions.Ready == nil || *e.Conditions.Ready) && len(e.Addresses) > 0 {
				return net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(target))), nil
			}
		}
	}
	return "", apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", svc.Name))
}
