// Package boltstore is orch's default store.Store: a bbolt file on disk for
// durable keys, an in-memory tier for volatile keys, one revision sequence
// and one watch stream over both.
//
// # On disk
//
// The bbolt file holds three buckets:
//
//	meta/
//	  rev        newest revision written by a durable commit
//	  ceiling    revisions below it may have been used by volatile writes
//	  compacted  history at or below it is forgotten
//	kv/
//	  <key> 0x00 <rev:8 big-endian>  ->  flags(1) createRev(uvarint) value
//	log/
//	  <rev:8 big-endian>             ->  <key>
//
// kv keeps every version of a key next to each other, oldest first, so a
// read at revision R seeks to the newest version at or below R and a prefix
// List is one cursor walk. log orders the same versions by revision, which
// is what watch replay and compaction walk. A deletion is a version with the
// tombstone flag. Keys may not contain 0x00.
//
// # Writes
//
// One goroutine commits: it takes every write queued while the previous
// commit was syncing, checks each one's compare-and-swap in order, gives
// each its own revision, and commits them in one bbolt transaction (one
// fsync pair). A lone writer waits for nothing but its own sync. Only after
// the commit is durable does the new revision become visible to readers and
// watchers and the writers get their answers.
//
// # Volatile keys and revisions
//
// Volatile writes take revisions from the same sequence without touching the
// disk. So that revisions never repeat after a restart, the committer
// reserves a block of revisions on disk (meta/ceiling) before using one
// beyond the reserve: one small write every volatileReserve volatile writes.
// History of volatile keys does not survive a restart, so a watch that needs
// it gets store.ErrCompacted and relists, as after an etcd compaction.
package boltstore
