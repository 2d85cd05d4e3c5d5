package boltstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/orch-dev/orch/internal/store"
)

var (
	bucketMeta = []byte("meta")
	bucketKV   = []byte("kv")
	bucketLog  = []byte("log")

	metaRev       = []byte("rev")
	metaCeiling   = []byte("ceiling")
	metaCompacted = []byte("compacted")
)

const flagTombstone = 1

// version is one stored version of a key.
type version struct {
	rev       int64
	createRev int64
	value     []byte
	tombstone bool
}

func (v version) keyValue(key string) store.KeyValue {
	return store.KeyValue{Key: key, Value: v.value, CreateRevision: v.createRev, ModRevision: v.rev}
}

func revBytes(rev int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(rev))
}

func versionKey(key string, rev int64) []byte {
	b := make([]byte, 0, len(key)+9)
	b = append(b, key...)
	b = append(b, 0)
	return binary.BigEndian.AppendUint64(b, uint64(rev))
}

// splitVersionKey parses a kv bucket key.
func splitVersionKey(k []byte) (key []byte, rev int64, ok bool) {
	if len(k) < 9 || k[len(k)-9] != 0 {
		return nil, 0, false
	}
	return k[:len(k)-9], int64(binary.BigEndian.Uint64(k[len(k)-8:])), true
}

func encodeVersion(v version) []byte {
	b := make([]byte, 1, 1+binary.MaxVarintLen64+len(v.value))
	if v.tombstone {
		b[0] = flagTombstone
	}
	b = binary.AppendUvarint(b, uint64(v.createRev))
	return append(b, v.value...)
}

// decodeVersion copies the value out: bbolt memory is valid only inside its
// transaction.
func decodeVersion(rev int64, b []byte) (version, error) {
	if len(b) < 2 {
		return version{}, fmt.Errorf("version %d: record too short", rev)
	}
	createRev, n := binary.Uvarint(b[1:])
	if n <= 0 {
		return version{}, fmt.Errorf("version %d: bad create revision", rev)
	}
	v := version{rev: rev, createRev: int64(createRev), tombstone: b[0]&flagTombstone != 0}
	if rest := b[1+n:]; len(rest) > 0 {
		v.value = bytes.Clone(rest)
	}
	return v, nil
}

func metaInt(tx *bolt.Tx, name []byte) int64 {
	b := tx.Bucket(bucketMeta).Get(name)
	if len(b) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

func putMetaInt(tx *bolt.Tx, name []byte, v int64) error {
	return tx.Bucket(bucketMeta).Put(name, revBytes(v))
}

func initBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketKV, bucketLog} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// checkReadable fails when a read at rev needs compacted history.
func checkReadable(tx *bolt.Tx, rev int64) error {
	if c := metaInt(tx, metaCompacted); rev < c {
		return fmt.Errorf("read at revision %d, compacted at %d: %w", rev, c, store.ErrCompacted)
	}
	return nil
}

// latestVersion finds key's newest version at or below atRev, tombstones
// included.
func latestVersion(c *bolt.Cursor, key string, atRev int64) (version, bool, error) {
	var k, v []byte
	if k, _ = c.Seek(versionKey(key, atRev+1)); k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	if k == nil {
		return version{}, false, nil
	}
	name, rev, ok := splitVersionKey(k)
	if !ok || string(name) != key {
		return version{}, false, nil
	}
	ver, err := decodeVersion(rev, v)
	return ver, err == nil, err
}

// durableGet reads key's live version at atRev.
func durableGet(tx *bolt.Tx, key string, atRev int64) (version, bool, error) {
	if err := checkReadable(tx, atRev); err != nil {
		return version{}, false, err
	}
	v, ok, err := latestVersion(tx.Bucket(bucketKV).Cursor(), key, atRev)
	if err != nil || !ok || v.tombstone {
		return version{}, false, err
	}
	return v, true, nil
}

// durableList walks the live keys under prefix from startKey at atRev, and
// stops after limit keys (0: no limit); skip drops keys another tier owns.
func durableList(tx *bolt.Tx, prefix, startKey string, atRev int64, limit int, skip func(string) bool) ([]store.KeyValue, error) {
	if err := checkReadable(tx, atRev); err != nil {
		return nil, err
	}
	c := tx.Bucket(bucketKV).Cursor()
	from := max(prefix, startKey)
	var (
		out     []store.KeyValue
		curKey  []byte
		best    []byte // encoded newest version <= atRev of curKey
		bestRev int64
	)
	flush := func() error {
		if best == nil || skip(string(curKey)) {
			return nil
		}
		v, err := decodeVersion(bestRev, best)
		if err != nil || v.tombstone {
			return err
		}
		out = append(out, v.keyValue(string(curKey)))
		return nil
	}
	for k, v := c.Seek([]byte(from)); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = c.Next() {
		name, rev, ok := splitVersionKey(k)
		if !ok {
			return nil, fmt.Errorf("corrupt kv key %q", k)
		}
		// Seeking to "a\x00" (the first key after "a") lands on a's own
		// versions, which sort there too.
		if string(name) < startKey {
			continue
		}
		if !bytes.Equal(name, curKey) {
			if err := flush(); err != nil {
				return nil, err
			}
			if limit > 0 && len(out) >= limit {
				return out, nil
			}
			curKey, best = append(curKey[:0], name...), nil
		}
		if rev <= atRev {
			best, bestRev = v, rev
		}
	}
	return out, flush()
}

// durablePut writes one version in a write transaction.
func durablePut(tx *bolt.Tx, key string, v version) error {
	if err := tx.Bucket(bucketKV).Put(versionKey(key, v.rev), encodeVersion(v)); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	if err := tx.Bucket(bucketLog).Put(revBytes(v.rev), []byte(key)); err != nil {
		return fmt.Errorf("log %q: %w", key, err)
	}
	return nil
}

// durableReplay calls fn for each durable event under prefix with a revision
// in (afterRev, uptoRev], in order.
func durableReplay(tx *bolt.Tx, prefix string, afterRev, uptoRev int64, fn func(store.Event)) error {
	if err := checkReadable(tx, afterRev); err != nil {
		return err
	}
	kv := tx.Bucket(bucketKV).Cursor()
	lc := tx.Bucket(bucketLog).Cursor()
	for k, key := lc.Seek(revBytes(afterRev + 1)); k != nil; k, key = lc.Next() {
		rev := int64(binary.BigEndian.Uint64(k))
		if rev > uptoRev {
			break
		}
		if !strings.HasPrefix(string(key), prefix) {
			continue
		}
		ev, err := eventAt(kv, string(key), rev)
		if err != nil {
			return err
		}
		fn(ev)
	}
	return nil
}

// eventAt rebuilds the event that wrote key's version rev.
func eventAt(kv *bolt.Cursor, key string, rev int64) (store.Event, error) {
	k, v := kv.Seek(versionKey(key, rev))
	if k == nil || !bytes.Equal(k, versionKey(key, rev)) {
		return store.Event{}, fmt.Errorf("log names %q at %d but kv lacks it", key, rev)
	}
	cur, err := decodeVersion(rev, v)
	if err != nil {
		return store.Event{}, err
	}
	ev := store.Event{Type: store.EventPut, KV: cur.keyValue(key), Revision: rev}
	if cur.tombstone {
		ev.Type, ev.KV = store.EventDelete, store.KeyValue{Key: key, ModRevision: rev}
	}
	if pk, pv := kv.Prev(); pk != nil {
		if name, prevRev, ok := splitVersionKey(pk); ok && string(name) == key {
			prev, err := decodeVersion(prevRev, pv)
			if err != nil {
				return store.Event{}, err
			}
			if !prev.tombstone {
				kvp := prev.keyValue(key)
				ev.PrevKV = &kvp
			}
		}
	}
	return ev, nil
}

// compactChunk forgets the history of up to maxEntries log entries at or
// below rev, and reports whether entries at or below rev remain.
func compactChunk(tx *bolt.Tx, rev int64, maxEntries int) (more bool, err error) {
	var (
		revs []int64
		keys = map[string]struct{}{}
	)
	lc := tx.Bucket(bucketLog).Cursor()
	for k, v := lc.First(); k != nil; k, v = lc.Next() {
		r := int64(binary.BigEndian.Uint64(k))
		if r > rev {
			break
		}
		if len(revs) == maxEntries {
			more = true
			break
		}
		revs = append(revs, r)
		keys[string(v)] = struct{}{}
	}
	kvb, logb := tx.Bucket(bucketKV), tx.Bucket(bucketLog)
	for key := range keys {
		if err := compactKey(kvb, key, rev); err != nil {
			return false, err
		}
	}
	for _, r := range revs {
		if err := logb.Delete(revBytes(r)); err != nil {
			return false, fmt.Errorf("compact log %d: %w", r, err)
		}
	}
	return more, nil
}

// compactKey keeps, of key's versions at or below rev, only the newest, and
// not even that if it is a tombstone: nothing at or above rev can see the
// others. Versions above rev are untouched.
func compactKey(kvb *bolt.Bucket, key string, rev int64) error {
	var (
		doomed    [][]byte
		newest    []byte
		tombstone bool
	)
	c := kvb.Cursor()
	for k, v := c.Seek(versionKey(key, 0)); k != nil; k, v = c.Next() {
		name, r, ok := splitVersionKey(k)
		if !ok || string(name) != key || r > rev {
			break
		}
		if newest != nil {
			doomed = append(doomed, newest)
		}
		newest, tombstone = bytes.Clone(k), len(v) > 0 && v[0]&flagTombstone != 0
	}
	if tombstone {
		doomed = append(doomed, newest)
	}
	for _, k := range doomed {
		if err := kvb.Delete(k); err != nil {
			return fmt.Errorf("compact %q: %w", key, err)
		}
	}
	return nil
}
