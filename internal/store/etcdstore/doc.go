// Package etcdstore is the store backend on etcd, for servers that share
// one cluster state: an external etcd (`--datastore-endpoint`). It speaks
// etcd's client API only, so an etcd the servers embed (not built yet)
// needs no other code.
//
// The store's operations are etcd's, one round trip each, in the shapes
// kube-apiserver uses: a create is a transaction on "mod revision = 0", an
// update or delete one on the expected mod revision, a list a range read at
// one revision (continued at it), a watch etcd's watch from a revision with
// previous values. Every watcher has a gRPC stream of its own so that a
// progress request reaches it alone; etcd drops one sent while the watcher
// is still catching up, so it is repeated until answered, as
// kube-apiserver's progress requester does.
//
// Compaction is etcd's. Several servers share one etcd, so the periodic
// compaction is claimed through a compare-and-swap on the version of one
// key (kube-apiserver's compact_rev_key): in each interval one server
// compacts, the others see it done.
//
// The memory tier of boltstore does not exist here: every server must see
// events and node leases, so they are ordinary keys. Keys of an expiring
// prefix (events) are put on etcd leases of their TTL, shared by the
// writes of a short window, so etcd deletes them as kube-apiserver's.
package etcdstore
