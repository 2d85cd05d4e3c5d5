// Package agent is the kubelet half of orch: it registers the node, keeps
// its lease, runs pods in containerd with a CNI network, serves logs and
// exec on :10250, and keeps a local checkpoint so pods survive a reboot
// while the server is unreachable.
package agent
