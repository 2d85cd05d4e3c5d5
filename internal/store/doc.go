// Package store defines orch's system of record: a watchable, multi-version
// key-value store with etcd's semantics. Only internal/api uses it; every
// other part of orch reaches state through the API.
//
// # Revision model
//
// One global revision counts every write. Each key carries the revision that
// created it and the revision that last modified it; the modification
// revision is what the API hands out as an object's resourceVersion.
//
//	revision:   1        2         3        4         5
//	write:      create a create b  update a delete b  create b
//	a:          c=1,m=1            c=1,m=3
//	b:                   c=2,m=2            (gone)    c=5,m=5
//
// Update and Delete are compare-and-swap on the modification revision, which
// gives the API optimistic concurrency (409 Conflict on a stale write).
// List reads at one revision, and a continued List keeps reading at the
// revision of its first page, so paging sees one consistent snapshot.
//
// # Watch
//
// Watch(prefix, rev) delivers every event with a revision greater than rev,
// in order, with the new and the previous value. Compaction forgets the
// history at or below a revision; a Watch or List that needs forgotten
// history fails with ErrCompacted (the API's 410 Gone). A watcher that falls
// too far behind is cut off with ErrWatcherTooSlow and resumes from the last
// revision it saw.
//
// # Tiers
//
// Keys under the prefixes a caller names as volatile (node leases, events)
// live in memory only, share the revision sequence and the watch stream, and
// never touch the disk, so an idle cluster does not wear out an SD card.
// They are lost when the process stops.
//
// The bbolt backend is in package boltstore; storetest holds the conformance
// suite every backend must pass.
package store
