// Package ingressclass is what the server and the nodes' ingress proxies
// agree on: the IngressClass the server makes, and the controller name
// that marks the classes whose Ingresses the nodes serve.
package ingressclass

// Name is the IngressClass the server makes, marked default unless a
// user unmarks it (orch server --disable ingress makes none).
const Name = "orch"

// Controller is the spec.controller of the classes orch serves: the
// nodes serve Ingresses of every class naming it, and leave the others
// to their controllers.
const Controller = "orch.io/ingress"
