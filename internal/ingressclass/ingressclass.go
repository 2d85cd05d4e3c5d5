// Package ingressclass is what the server and the nodes' ingress proxies
// agree on: the IngressClass the server makes, and the controller name
// that marks the classes whose Ingresses the nodes serve.
package ingressclass

import networkingv1 "k8s.io/api/networking/v1"

// Name is the IngressClass the server makes, marked default unless a
// user unmarks it (orch server --disable ingress makes none).
const Name = "orch"

// Controller is the spec.controller of the classes orch serves: the
// nodes serve Ingresses of every class naming it, and leave the others
// to their controllers.
const Controller = "orch.io/ingress"

// Annotation is the class an Ingress named before spec.ingressClassName,
// which controllers still honour (k8s.io/api has it only in the
// networking v1beta1 package, which the binary does not otherwise link).
const Annotation = "kubernetes.io/ingress.class"

// Of is the class an Ingress names: spec.ingressClassName, else the
// older annotation; "" for none.
func Of(in *networkingv1.Ingress) string {
	if in.Spec.IngressClassName != nil {
		return *in.Spec.IngressClassName
	}
	return in.Annotations[Annotation]
}

// Ours is the names of the classes orch's controller serves.
func Ours(classes []*networkingv1.IngressClass) map[string]bool {
	ours := map[string]bool{}
	for _, c := range classes {
		if c.Spec.Controller == Controller {
			ours[c.Name] = true
		}
	}
	return ours
}
