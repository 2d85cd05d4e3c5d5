// Package e2e holds the end-to-end tests, behind the e2e build tag: orch
// built and run as processes (a server, agents), real containers, the
// server killed and started again. They need root, containerd, runc and
// the CNI plugins; `make e2e` (and `make test`) runs them:
//
//	go test -tags e2e ./e2e/
package e2e
