package api

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/orch-dev/orch/internal/kube"
)

// A server running its agent marks its Node with its etcd member's name
// and a finalizer: `kubectl delete node` of a server removes its member
// before the Node goes, as k3s's member controller does. The etcd leader
// does the removals, handing leadership over first when the member is its
// own.
const (
	etcdMemberAnnotation = "etcd.orch.dev/member"
	etcdMemberFinalizer  = "etcd.orch.dev/member"
)

// removedMarker, in DATA/server/db, says the cluster removed this server's
// member: it joins anew only when told where (--server).
const removedMarker = "etcd-removed"

func (s *Server) manageMembers(ctx context.Context, every time.Duration) {
	client, err := kube.NewForConfig(s.Loopback())
	if err != nil {
		s.log.Error("etcd members of deleted Nodes cannot be removed", "err", err)
		return
	}
	marked := s.cfg.NodeName == ""
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.member.Done():
			return
		case <-t.C:
		}
		if !marked {
			marked = s.markOwnNode(ctx, client)
		}
		if s.member.IsLeader() {
			s.removeDeletedMembers(ctx, client)
		}
	}
}

// markOwnNode names this server's member on its Node, once the agent has
// registered it.
func (s *Server) markOwnNode(ctx context.Context, client *kube.Client) bool {
	node, err := client.Nodes().Get(ctx, s.cfg.NodeName, metav1.GetOptions{})
	if err != nil || node.DeletionTimestamp != nil {
		return false
	}
	if node.Annotations[etcdMemberAnnotation] == s.member.Name() && slices.Contains(node.Finalizers, etcdMemberFinalizer) {
		return true
	}
	finalizers := node.Finalizers
	if !slices.Contains(finalizers, etcdMemberFinalizer) {
		finalizers = append(slices.Clip(finalizers), etcdMemberFinalizer)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": node.ResourceVersion, // the finalizers are replaced whole
		"annotations":     map[string]string{etcdMemberAnnotation: s.member.Name()},
		"finalizers":      finalizers,
	}})
	if err != nil {
		return false
	}
	if _, err := client.Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		s.log.Warn("marking this server's Node with its etcd member", "node", node.Name, "err", err)
		return false
	}
	return true
}

// removeDeletedMembers removes the members of the servers whose Nodes are
// being deleted, then lets the Nodes go.
func (s *Server) removeDeletedMembers(ctx context.Context, client *kube.Client) {
	nodes, err := client.Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, node := range nodes.Items {
		if node.DeletionTimestamp == nil || !slices.Contains(node.Finalizers, etcdMemberFinalizer) {
			continue
		}
		done, err := s.member.Remove(ctx, node.Annotations[etcdMemberAnnotation])
		if err != nil {
			s.log.Warn("removing the etcd member of a deleted Node", "node", node.Name, "err", err)
			continue
		}
		if !done {
			continue // leadership handed over: the next leader removes it
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": node.ResourceVersion,
			"finalizers":      slices.DeleteFunc(slices.Clone(node.Finalizers), func(f string) bool { return f == etcdMemberFinalizer }),
		}})
		if err != nil {
			continue
		}
		if _, err := client.Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			s.log.Warn("letting a deleted server's Node go", "node", node.Name, "err", err)
		}
	}
}

// memberStopped is why Run ends when the member stopped on its own.
func (s *Server) memberStopped() error {
	if !s.member.Removed() {
		return fmt.Errorf("this server's etcd member stopped (see etcd's log above)")
	}
	marker := filepath.Join(s.cfg.DataDir, "server", "db", removedMarker)
	if err := os.WriteFile(marker, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		s.log.Warn("marking the member removed", "err", err)
	}
	return fmt.Errorf("this server's etcd member was removed from the cluster (its Node deleted, or etcdctl member remove): start it again with --server https://<a server>:6443 and the server token to join anew")
}
