// Package api is orch's API server, the only part of orch that touches the
// store: HTTPS, PKI and the join flow, authentication, authorization and
// admission, the registry of Kubernetes resources, REST and watch handlers,
// discovery and tables. Everything else reaches cluster state through it.
//
// This package wires the server and routes its requests; the rooms it
// wires are its subpackages: auth/ (who is calling, what they may do,
// the node graph), admission/ (the built-in plugins, webhooks and
// policies), registry/ (Kubernetes' object semantics over the store),
// rest/ (HTTP), resources/ (the served kinds), join/ (nodes joining).
package api
