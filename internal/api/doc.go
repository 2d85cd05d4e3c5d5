// Package api is orch's API server, the only part of orch that touches the
// store: HTTPS, PKI and the join flow, authentication, authorization and
// admission, the registry of Kubernetes resources, REST and watch handlers,
// discovery and tables. Everything else reaches cluster state through it.
package api
