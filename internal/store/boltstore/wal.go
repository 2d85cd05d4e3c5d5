package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// The write-ahead log makes a batch durable with one fdatasync of a file
// that never changes size, instead of the two syncs of a bbolt commit.
// Batches are checkpointed into bbolt from memory now and then, and the log
// starts over.
//
//	header:  "orchwal1" generation(8)
//	record:  length(4) crc32c(generation, payload)(4) payload
//	payload: count, then per version: rev flags createRev len(key) key len(value) value (uvarints)
//
// Starting over bumps the generation, so records left from an earlier
// generation fail their checksum and end the replay, as does a torn write.
type wal struct {
	f          *os.File
	generation uint64
	offset     int64
	size       int64
}

const (
	walMagic      = "orchwal1"
	walHeaderSize = 16
	// DefaultWALSize is the log's fixed size; a checkpoint empties it
	// before it fills.
	DefaultWALSize = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// openWAL opens or creates the log and returns the versions it holds.
func openWAL(path string, size int64) (*wal, []memWrite, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open wal: %w", err)
	}
	w := &wal{f: f, size: size}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("stat wal: %w", err)
	}
	if st.Size() < size {
		// Written out in full once, so later syncs change no metadata.
		if err := w.fill(st.Size()); err != nil {
			_ = f.Close()
			return nil, nil, err
		}
	} else {
		w.size = st.Size()
	}
	versions, err := w.replay()
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return w, versions, nil
}

func (w *wal) fill(from int64) error {
	zeros := make([]byte, 1<<20)
	for off := from; off < w.size; off += int64(len(zeros)) {
		n := min(int64(len(zeros)), w.size-off)
		if _, err := w.f.WriteAt(zeros[:n], off); err != nil {
			return fmt.Errorf("preallocate wal: %w", err)
		}
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("sync wal: %w", err)
	}
	return nil
}

// replay reads the current generation's records up to the first bad one.
func (w *wal) replay() ([]memWrite, error) {
	head := make([]byte, walHeaderSize)
	if _, err := w.f.ReadAt(head, 0); err != nil {
		return nil, fmt.Errorf("read wal header: %w", err)
	}
	w.offset = walHeaderSize
	if string(head[:8]) != walMagic {
		return nil, nil // new, or never started: nothing to replay
	}
	w.generation = binary.BigEndian.Uint64(head[8:])
	var out []memWrite
	for {
		payload, ok := w.readRecord(w.offset)
		if !ok {
			return out, nil
		}
		vs, err := decodeWALPayload(payload)
		if err != nil {
			return nil, fmt.Errorf("wal record at %d: %w", w.offset, err)
		}
		out = append(out, vs...)
		w.offset += 8 + int64(len(payload))
	}
}

func (w *wal) readRecord(off int64) ([]byte, bool) {
	var hdr [8]byte
	if _, err := w.f.ReadAt(hdr[:], off); err != nil {
		return nil, false
	}
	n := int64(binary.BigEndian.Uint32(hdr[:4]))
	if n == 0 || off+8+n > w.size {
		return nil, false
	}
	payload := make([]byte, n)
	if _, err := w.f.ReadAt(payload, off+8); err != nil && !errors.Is(err, io.EOF) {
		return nil, false
	}
	if w.checksum(payload) != binary.BigEndian.Uint32(hdr[4:]) {
		return nil, false
	}
	return payload, true
}

func (w *wal) checksum(payload []byte) uint32 {
	var g [8]byte
	binary.BigEndian.PutUint64(g[:], w.generation)
	return crc32.Update(crc32.Checksum(g[:], castagnoli), castagnoli, payload)
}

// fits reports whether a record of n payload bytes fits.
func (w *wal) fits(n int) bool { return w.offset+8+int64(n) <= w.size }

// append writes one record and syncs it.
func (w *wal) append(payload []byte) error {
	if !w.fits(len(payload)) {
		return fmt.Errorf("wal record of %d bytes does not fit", len(payload))
	}
	rec := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(rec, uint32(len(payload)))
	binary.BigEndian.PutUint32(rec[4:], w.checksum(payload))
	rec = append(rec, payload...)
	if _, err := w.f.WriteAt(rec, w.offset); err != nil {
		return fmt.Errorf("write wal: %w", err)
	}
	if err := fdatasync(w.f); err != nil {
		return fmt.Errorf("sync wal: %w", err)
	}
	w.offset += int64(len(rec))
	return nil
}

// reset starts a new generation: everything logged so far is in bbolt.
func (w *wal) reset() error {
	head := make([]byte, walHeaderSize)
	copy(head, walMagic)
	binary.BigEndian.PutUint64(head[8:], w.generation+1)
	if _, err := w.f.WriteAt(head, 0); err != nil {
		return fmt.Errorf("reset wal: %w", err)
	}
	if err := fdatasync(w.f); err != nil {
		return fmt.Errorf("sync wal: %w", err)
	}
	w.generation++
	w.offset = walHeaderSize
	return nil
}

func (w *wal) close() error { return w.f.Close() }

func encodeWALPayload(vs []memWrite) []byte {
	b := binary.AppendUvarint(nil, uint64(len(vs)))
	for _, wv := range vs {
		b = binary.AppendUvarint(b, uint64(wv.v.rev))
		flags := byte(0)
		if wv.v.tombstone {
			flags = flagTombstone
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, uint64(wv.v.createRev))
		b = binary.AppendUvarint(b, uint64(len(wv.key)))
		b = append(b, wv.key...)
		b = binary.AppendUvarint(b, uint64(len(wv.v.value)))
		b = append(b, wv.v.value...)
	}
	return b
}

func decodeWALPayload(b []byte) ([]memWrite, error) {
	r := walReader{b: b}
	n := r.uvarint()
	var out []memWrite
	for i := uint64(0); i < n && r.err == nil; i++ {
		var wv memWrite
		wv.v.rev = int64(r.uvarint())
		wv.v.tombstone = r.byte()&flagTombstone != 0
		wv.v.createRev = int64(r.uvarint())
		wv.key = string(r.bytes())
		if val := r.bytes(); len(val) > 0 {
			wv.v.value = val
		}
		out = append(out, wv)
	}
	return out, r.err
}

type walReader struct {
	b   []byte
	err error
}

func (r *walReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err, r.b = errors.New("truncated varint"), nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *walReader) byte() byte {
	if len(r.b) == 0 {
		r.err = errors.New("truncated record")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *walReader) bytes() []byte {
	n := r.uvarint()
	if uint64(len(r.b)) < n {
		r.err, r.b = errors.New("truncated bytes"), nil
		return nil
	}
	out := append([]byte(nil), r.b[:n]...)
	r.b = r.b[n:]
	return out
}
