// Package boltstore is orch's default store.Store: a bbolt file on disk for
// durable keys, an in-memory tier for volatile keys, one revision sequence
// and one watch stream over both.
//
// # On disk
//
// Two files: orch.wal, a fixed-size write-ahead log (see wal.go), and
// orch.db, a bbolt file with three buckets:
//
//	meta/
//	  rev        newest revision checkpointed into bbolt
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
// each its own revision, appends them as one WAL record and syncs it once
// (fdatasync of a preallocated file: one flush, as etcd's WAL). A lone
// writer waits for nothing but its own sync. Only then do the new versions
// enter the memory tier, become visible to readers and watchers, and the
// writers get their answers.
//
// Every second, or sooner when the WAL or the watch ring fills, the
// committer checkpoints: one bbolt commit with every logged version, then
// the WAL starts over and memory forgets those versions. Between
// checkpoints, reads take a key's state from memory when memory has it and
// from bbolt otherwise. After a crash, Open moves what the WAL holds past
// bbolt's meta/rev into bbolt before serving. The ring of recent events
// always covers everything not yet checkpointed, so watch replay from disk
// never misses a logged event.
//
// # Volatile keys and revisions
//
// Volatile writes take revisions from the same sequence and live only in the
// memory tier. So that revisions never repeat after a restart, the
// committer reserves a block of revisions on disk (meta/ceiling) before
// using one beyond the reserve: one small write every volatileReserve
// volatile writes. History of volatile keys does not survive a restart, so
// a watch that needs it gets store.ErrCompacted and relists, as after an
// etcd compaction.
//
// # Compaction
//
// Every interval, history older than the previous tick is forgotten: reads
// and watches from before it fail with store.ErrCompacted, and memory lets
// go of its volatile versions. bbolt forgets its part (the log's entries
// and every version a newer one hides, which rewrites the pages holding
// them) only every 12 intervals, or sooner once 10,000 writes wait: fewer,
// larger compactions for an SD card, and none in a board's first minutes
// of everything its start wrote. When bbolt holds no version that old to
// forget (a quiet cluster's revisions are its Lease renewals', all
// volatile), nothing is written at all.
package boltstore
