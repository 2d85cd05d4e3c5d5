package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"

	"github.com/orch-dev/orch/internal/api/alloc"
	"github.com/orch-dev/orch/internal/api/registry"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// serviceIPs allocates cluster IPs and node ports for Services.
type serviceIPs struct {
	ips   *alloc.IPs
	ports *alloc.Ports
	// claims, with servers sharing a datastore, make each address one
	// Service's across them; nil for a single server.
	claims *claims
}

// claimTries bounds how many addresses the allocator offers that another
// server's Services turn out to hold before it gives up.
const claimTries = 64

var (
	clusterIPPath = field.NewPath("spec", "clusterIP")
	portsPath     = field.NewPath("spec", "ports")
)

func (s *serviceIPs) admit(ctx context.Context, obj, old runtime.Object) error {
	svc := obj.(*corev1.Service)
	var prev *corev1.Service
	if old != nil {
		prev = old.(*corev1.Service)
	}
	var errs field.ErrorList
	var taken []func()
	owner := svc.Namespace + "/" + svc.Name
	rollback := func() {
		for _, undo := range taken {
			undo()
		}
	}
	wantIP := svc.Spec.Type != corev1.ServiceTypeExternalName
	switch {
	case !wantIP:
		if prev == nil {
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", nil
		}
	case prev != nil && prev.Spec.ClusterIP != "":
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = prev.Spec.ClusterIP, prev.Spec.ClusterIPs
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		svc.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	case svc.Spec.ClusterIP != "":
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil {
			errs = append(errs, field.Invalid(clusterIPPath, svc.Spec.ClusterIP, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"))
			break
		}
		err = s.ips.Allocate(ip)
		if err == nil {
			if err = s.claims.take(ctx, "ip", ip.String(), owner); err != nil && !errors.Is(err, errClaimed) {
				s.ips.Release(ip)
				return apierrors.NewInternalError(err)
			}
		}
		if err != nil {
			msg := fmt.Sprintf("failed to allocate IP %s: %v", ip, err)
			if errors.Is(err, alloc.ErrNotInRange) {
				msg = fmt.Sprintf("failed to allocate IP %s: the provided IP (%s) is not in the valid range. The range of valid IPs is %s", ip, ip, err)
			}
			errs = append(errs, field.Invalid(clusterIPPath, svc.Spec.ClusterIP, msg))
			break
		}
		taken = append(taken, func() { s.ips.Release(ip); s.claims.free("ip", ip.String()) })
		svc.Spec.ClusterIPs = []string{ip.String()}
	default:
		var ip netip.Addr
		for try := 0; ; try++ {
			var err error
			if ip, err = s.ips.Next(); err == nil {
				// One another server's Service holds stays taken here.
				if err = s.claims.take(ctx, "ip", ip.String(), owner); errors.Is(err, errClaimed) && try < claimTries {
					continue
				}
			}
			if err != nil {
				return apierrors.NewInternalError(fmt.Errorf("failed to allocate a serviceIP: %w", err))
			}
			break
		}
		taken = append(taken, func() { s.ips.Release(ip); s.claims.free("ip", ip.String()) })
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip.String(), []string{ip.String()}
	}
	needPorts := svc.Spec.Type == corev1.ServiceTypeNodePort ||
		svc.Spec.Type == corev1.ServiceTypeLoadBalancer && (svc.Spec.AllocateLoadBalancerNodePorts == nil || *svc.Spec.AllocateLoadBalancerNodePorts)
	held := map[int32]bool{}
	if prev != nil {
		for _, p := range prev.Spec.Ports {
			if p.NodePort != 0 {
				held[p.NodePort] = true
			}
		}
	}
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		switch {
		case !needPorts:
			if p.NodePort != 0 && !held[p.NodePort] {
				p.NodePort = 0
			}
		case p.NodePort == 0:
			var port int
			for try := 0; ; try++ {
				var err error
				if port, err = s.ports.Next(); err == nil {
					if err = s.claims.take(ctx, "nodeport", strconv.Itoa(port), owner); errors.Is(err, errClaimed) && try < claimTries {
						continue
					}
				}
				if err != nil {
					rollback()
					return apierrors.NewInternalError(fmt.Errorf("failed to allocate a nodePort: %w", err))
				}
				break
			}
			taken = append(taken, func() { s.ports.Release(port); s.claims.free("nodeport", strconv.Itoa(port)) })
			p.NodePort = int32(port)
		case held[p.NodePort]:
		default:
			port := int(p.NodePort)
			err := s.ports.Allocate(port)
			if err == nil {
				if err = s.claims.take(ctx, "nodeport", strconv.Itoa(port), owner); err != nil && !errors.Is(err, errClaimed) {
					s.ports.Release(port)
					rollback()
					return apierrors.NewInternalError(err)
				}
			}
			if err != nil {
				msg := "provided port is already allocated"
				if errors.Is(err, alloc.ErrNotInRange) {
					msg = fmt.Sprintf("provided port is not in the valid range. The range of valid ports is %s", s.ports.Range())
				}
				errs = append(errs, field.Invalid(portsPath.Index(i).Child("nodePort"), p.NodePort, msg))
				continue
			}
			taken = append(taken, func() { s.ports.Release(port); s.claims.free("nodeport", strconv.Itoa(port)) })
		}
	}
	if len(errs) > 0 {
		rollback()
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, errs)
	}
	return nil
}

// committed frees what an update gave up: node ports no longer used.
func (s *serviceIPs) committed(obj, old runtime.Object) {
	svc, prev := obj.(*corev1.Service), old.(*corev1.Service)
	if svc.Spec.ClusterIP != prev.Spec.ClusterIP {
		// An address let go (the Service became an ExternalName).
		if ip, err := netip.ParseAddr(prev.Spec.ClusterIP); err == nil {
			s.ips.Release(ip)
			s.claims.free("ip", ip.String())
		}
	}
	kept := map[int32]bool{}
	for _, p := range svc.Spec.Ports {
		kept[p.NodePort] = true
	}
	for _, p := range prev.Spec.Ports {
		if p.NodePort != 0 && !kept[p.NodePort] {
			s.ports.Release(int(p.NodePort))
			s.claims.free("nodeport", strconv.Itoa(int(p.NodePort)))
		}
	}
}

// abandoned frees what admission took for an update that never reached
// the store: what obj holds and old does not.
func (s *serviceIPs) abandoned(obj, old runtime.Object) {
	svc, prev := obj.(*corev1.Service), old.(*corev1.Service)
	if svc.Spec.ClusterIP != prev.Spec.ClusterIP {
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil {
			s.ips.Release(ip)
			s.claims.free("ip", ip.String())
		}
	}
	held := map[int32]bool{}
	for _, p := range prev.Spec.Ports {
		held[p.NodePort] = true
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 && !held[p.NodePort] {
			s.ports.Release(int(p.NodePort))
			s.claims.free("nodeport", strconv.Itoa(int(p.NodePort)))
		}
	}
}

// release frees everything a deleted Service held.
func (s *serviceIPs) release(obj runtime.Object) {
	svc := obj.(*corev1.Service)
	if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil {
		s.ips.Release(ip)
		s.claims.free("ip", ip.String())
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			s.ports.Release(int(p.NodePort))
			s.claims.free("nodeport", strconv.Itoa(int(p.NodePort)))
		}
	}
}

// restore marks the stored Services' IPs and ports as taken.
func (s *serviceIPs) restore(ctx context.Context, services *registry.Storage, log *slog.Logger) error {
	list, err := services.List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	// A stored Service whose address or port cannot be taken (the service
	// CIDR changed, or two Services hold one) keeps it, but is said: new
	// Services are then given only what no stored one holds.
	held := map[string]string{}
	for _, svc := range list.(*corev1.ServiceList).Items {
		owner := svc.Namespace + "/" + svc.Name
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil {
			held[claimKey("ip", ip.String())] = owner
			if err := s.ips.Allocate(ip); err != nil {
				log.Warn("a stored Service's cluster IP cannot be reserved", "service", svc.Namespace+"/"+svc.Name, "ip", ip, "err", err)
			}
		}
		for _, p := range svc.Spec.Ports {
			if p.NodePort != 0 {
				held[claimKey("nodeport", strconv.Itoa(int(p.NodePort)))] = owner
				if err := s.ports.Allocate(int(p.NodePort)); err != nil {
					log.Warn("a stored Service's node port cannot be reserved", "service", svc.Namespace+"/"+svc.Name, "port", p.NodePort, "err", err)
				}
			}
		}
	}
	if err := s.claims.repair(ctx, held); err != nil {
		return fmt.Errorf("the Services' claims in the datastore: %w", err)
	}
	return nil
}
