// Package checkpoint is the agent's local copy of what it needs to run
// its pods without the API server: the pods bound to the node, the
// ConfigMaps they use and the node's pod network. After a reboot while
// the server is unreachable the agent starts the pods again from it (the
// case k3s, k0s and Nomad get wrong). It lives in DATA/agent/checkpoint.db
// (bbolt), written only when a pod starts, changes its spec or goes, or a
// ConfigMap it uses changes, never for status: an SD card wears with every
// write. Secrets are not kept: they stay off the disk.
package checkpoint

import (
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

var (
	podsBucket       = []byte("pods")
	configMapsBucket = []byte("configmaps")
	nodeBucket       = []byte("node")
	podCIDRKey       = []byte("podCIDR")
)

// Checkpoint is the open checkpoint file.
type Checkpoint struct {
	db *bolt.DB
}

// Open opens (creating) the checkpoint at path.
func Open(path string) (*Checkpoint, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{podsBucket, configMapsBucket, nodeBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return &Checkpoint{db: db}, nil
}

// Close closes the file.
func (c *Checkpoint) Close() error { return c.db.Close() }

// SavePod records a pod the node runs (its metadata, spec and status as
// they are now).
func (c *Checkpoint) SavePod(pod *corev1.Pod) error {
	data, err := pod.Marshal()
	if err != nil {
		return fmt.Errorf("checkpoint pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	// Batch: pods starting together share one transaction (and one
	// fsync), so a burst of pods does not queue on the disk.
	return c.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(podsBucket).Put([]byte(pod.UID), data)
	})
}

// DeletePod forgets a pod the node no longer runs.
func (c *Checkpoint) DeletePod(uid types.UID) error {
	return c.deleteKey(podsBucket, []byte(uid))
}

// deleteKey deletes key from bucket; a key that is not there costs no
// write (the SD card).
func (c *Checkpoint) deleteKey(bucket, key []byte) error {
	var known bool
	_ = c.db.View(func(tx *bolt.Tx) error {
		known = tx.Bucket(bucket).Get(key) != nil
		return nil
	})
	if !known {
		return nil
	}
	return c.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete(key)
	})
}

// Pods are the pods recorded.
func (c *Checkpoint) Pods() ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	err := c.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(podsBucket).ForEach(func(k, v []byte) error {
			pod := &corev1.Pod{}
			if err := pod.Unmarshal(v); err != nil {
				return fmt.Errorf("checkpointed pod %s: %w", k, err)
			}
			out = append(out, pod)
			return nil
		})
	})
	return out, err
}

// SaveConfigMap records a ConfigMap the node's pods use, unless the
// record has it at this resourceVersion already: a ConfigMap read again
// unchanged costs no write.
func (c *Checkpoint) SaveConfigMap(cm *corev1.ConfigMap) error {
	if saved, err := c.ConfigMap(cm.Namespace, cm.Name); err == nil && saved != nil && saved.ResourceVersion == cm.ResourceVersion && saved.UID == cm.UID {
		return nil
	}
	data, err := cm.Marshal()
	if err != nil {
		return fmt.Errorf("checkpoint configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return c.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(configMapsBucket).Put([]byte(cm.Namespace+"/"+cm.Name), data)
	})
}

// ConfigMap is the recorded ConfigMap, nil when there is none.
func (c *Checkpoint) ConfigMap(namespace, name string) (*corev1.ConfigMap, error) {
	var out *corev1.ConfigMap
	err := c.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(configMapsBucket).Get([]byte(namespace + "/" + name))
		if v == nil {
			return nil
		}
		out = &corev1.ConfigMap{}
		return out.Unmarshal(v)
	})
	if err != nil {
		return nil, fmt.Errorf("checkpointed configmap %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// DeleteConfigMap forgets a ConfigMap that is gone.
func (c *Checkpoint) DeleteConfigMap(namespace, name string) error {
	return c.deleteKey(configMapsBucket, []byte(namespace+"/"+name))
}

// Node is the node's pod network and allocatable resources, as last
// recorded.
type Node struct {
	PodCIDR     string
	Allocatable corev1.ResourceList
}

// SaveNode records the node's pod network and allocatable resources when
// they changed.
func (c *Checkpoint) SaveNode(n Node) error {
	if old, err := c.Node(); err == nil && old.PodCIDR == n.PodCIDR && sameResources(old.Allocatable, n.Allocatable) {
		return nil
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(nodeBucket)
		if err := b.Put(podCIDRKey, []byte(n.PodCIDR)); err != nil {
			return err
		}
		for name, q := range n.Allocatable {
			if err := b.Put([]byte("allocatable/"+name), []byte(q.String())); err != nil {
				return err
			}
		}
		return nil
	})
}

// Node reads what SaveNode recorded; PodCIDR is empty when nothing was.
func (c *Checkpoint) Node() (Node, error) {
	n := Node{Allocatable: corev1.ResourceList{}}
	err := c.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(nodeBucket)
		n.PodCIDR = string(b.Get(podCIDRKey))
		return b.ForEach(func(k, v []byte) error {
			if name, ok := strings.CutPrefix(string(k), "allocatable/"); ok {
				q, err := resource.ParseQuantity(string(v))
				if err != nil {
					return err
				}
				n.Allocatable[corev1.ResourceName(name)] = q
			}
			return nil
		})
	})
	return n, err
}

func sameResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}
