// Package logs keeps containers' output as the kubelet does: one file per
// container run in the CRI log format ("<RFC 3339 time> <stream> <F|P>
// <text>", F for a full line, P for part of a longer one), rotated at a
// size limit so that a chatty container cannot fill (or wear out) the
// node's disk; and reads it back for `kubectl logs` with its options
// (follow, tail, since, timestamps, limit).
package logs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// MaxLineSize is the longest line kept whole; longer ones are split into
// partial (P) entries, as the CRI runtime does.
const MaxLineSize = 16 * 1024

// Writer appends a container's stdout and stderr to its log file,
// rotating it to path.1 when it passes MaxSize.
type Writer struct {
	path    string
	maxSize int64

	mu   sync.Mutex
	f    *os.File
	size int64
	now  func() time.Time
}

// NewWriter opens (appending) the log file at path.
func NewWriter(path string, maxSize int64) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("container log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &Writer{path: path, maxSize: maxSize, f: f, size: fi.Size(), now: time.Now}, nil
}

// Stdout and Stderr are the writers for the container's two streams.
func (w *Writer) Stdout() io.Writer { return &stream{w: w, name: "stdout"} }

// Stderr is the writer for the container's stderr.
func (w *Writer) Stderr() io.Writer { return &stream{w: w, name: "stderr"} }

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// stream turns one output stream into log entries.
type stream struct {
	w       *Writer
	name    string
	partial []byte
}

func (s *stream) Write(p []byte) (int, error) {
	n := len(p)
	var out bytes.Buffer
	now := s.w.now().UTC().Format(time.RFC3339Nano)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.partial = append(s.partial, p...)
			for len(s.partial) >= MaxLineSize {
				fmt.Fprintf(&out, "%s %s P %s\n", now, s.name, s.partial[:MaxLineSize])
				s.partial = s.partial[MaxLineSize:]
			}
			break
		}
		line := p[:i]
		if len(s.partial) > 0 {
			line = append(s.partial, line...)
			s.partial = nil
		}
		for len(line) > MaxLineSize {
			fmt.Fprintf(&out, "%s %s P %s\n", now, s.name, line[:MaxLineSize])
			line = line[MaxLineSize:]
		}
		fmt.Fprintf(&out, "%s %s F %s\n", now, s.name, line)
		p = p[i+1:]
	}
	if out.Len() == 0 {
		return n, nil
	}
	if err := s.w.append(out.Bytes()); err != nil {
		return 0, err
	}
	return n, nil
}

// Flush writes what the stream holds of a line not ended yet as a full
// line: at the end of the container's output, its last words without a
// newline (`printf DONE`) are logged, as containerd's CRI logs them.
func (s *stream) Flush() error {
	if len(s.partial) == 0 {
		return nil
	}
	line := s.partial
	s.partial = nil
	return s.w.append(fmt.Appendf(nil, "%s %s F %s\n", s.w.now().UTC().Format(time.RFC3339Nano), s.name, line))
}

func (w *Writer) append(entries []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return os.ErrClosed
	}
	if w.size > 0 && w.size+int64(len(entries)) > w.maxSize {
		if err := w.rotate(); err != nil {
			return err
		}
	}
	n, err := w.f.Write(entries)
	w.size += int64(n)
	return err
}

// rotate keeps one older file, as path.1.
func (w *Writer) rotate() error {
	if err := w.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(w.path, w.path+".1"); err != nil {
		return err
	}
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		w.f = nil
		return err
	}
	w.f, w.size = f, 0
	return nil
}

// Options are kubectl logs' options, as PodLogOptions carries them.
type Options struct {
	Follow     bool
	Tail       int64 // lines from the end; negative for all
	Since      time.Time
	Timestamps bool
	LimitBytes int64 // 0 for no limit
}

// entry is one parsed log line.
type entry struct {
	at      time.Time
	stamp   []byte
	full    bool
	content []byte
}

func parse(line []byte) (entry, bool) {
	// <time> <stream> <tag> <content>
	parts := bytes.SplitN(line, []byte(" "), 4)
	if len(parts) < 3 {
		return entry{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, string(parts[0]))
	if err != nil {
		return entry{}, false
	}
	e := entry{at: at, stamp: parts[0], full: string(parts[2]) == "F"}
	if len(parts) == 4 {
		e.content = parts[3]
	}
	return e, true
}

// errLimit ends a read at LimitBytes.
var errLimit = errors.New("limit reached")

// printer writes entries as kubectl shows them.
type printer struct {
	out  io.Writer
	opts Options
	sent int64
	// midLine is set after a partial entry: the next one continues it and
	// gets no timestamp of its own.
	midLine bool
}

func (p *printer) print(e entry) error {
	if !p.opts.Since.IsZero() && e.at.Before(p.opts.Since) {
		return nil
	}
	var b []byte
	if p.opts.Timestamps && !p.midLine {
		b = append(append(b, e.stamp...), ' ')
	}
	b = append(b, e.content...)
	if e.full {
		b = append(b, '\n')
	}
	p.midLine = !e.full
	if p.opts.LimitBytes > 0 && p.sent+int64(len(b)) > p.opts.LimitBytes {
		b = b[:p.opts.LimitBytes-p.sent]
	}
	n, err := p.out.Write(b)
	p.sent += int64(n)
	if err != nil {
		return err
	}
	if p.opts.LimitBytes > 0 && p.sent >= p.opts.LimitBytes {
		return errLimit
	}
	return nil
}

// Read writes the log at path (after its rotated part) to out. With
// Follow it keeps reading what is appended, across rotations, until ctx
// ends or running reports the container gone and the file is drained.
func Read(ctx context.Context, path string, opts Options, out io.Writer, running func() bool) error {
	p := &printer{out: out, opts: opts}
	var lines [][]byte
	for _, name := range []string{path + ".1", path} {
		data, err := os.ReadFile(name)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		for _, l := range bytes.SplitAfter(data, []byte("\n")) {
			if len(l) > 0 && l[len(l)-1] == '\n' {
				lines = append(lines, l[:len(l)-1])
			}
		}
	}
	if opts.Tail >= 0 {
		lines = tail(lines, opts.Tail)
	}
	var offset int64
	if fi, err := os.Stat(path); err == nil {
		offset = fi.Size()
	}
	for _, l := range lines {
		if e, ok := parse(l); ok {
			if err := p.print(e); err != nil {
				return ignoreLimit(err)
			}
		}
	}
	if !opts.Follow {
		return nil
	}
	return ignoreLimit(follow(ctx, path, offset, p, running))
}

func ignoreLimit(err error) error {
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

// tail keeps the last n lines, counting a long line's partial entries
// as one line as the kubelet does.
func tail(lines [][]byte, n int64) [][]byte {
	if n == 0 {
		return nil
	}
	count := int64(0)
	for i := len(lines) - 1; i >= 0; i-- {
		if e, ok := parse(lines[i]); ok && e.full {
			count++
			if count > n {
				return lines[i+1:]
			}
		}
	}
	return lines
}

// follow polls the file for what is appended after offset.
func follow(ctx context.Context, path string, offset int64, p *printer, running func() bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReader(f)
	var pending []byte
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			if e, ok := parse(append(pending, line[:len(line)-1]...)); ok {
				if err := p.print(e); err != nil {
					return err
				}
			}
			pending = nil
			continue
		}
		pending = append(pending, line...)
		if err != nil && err != io.EOF {
			return err
		}
		// At the end: has the file been rotated under us?
		if cur, err := os.Stat(path); err == nil {
			if open, err := f.Stat(); err == nil && !os.SameFile(cur, open) {
				nf, err := os.Open(path)
				if err != nil {
					return err
				}
				_ = f.Close()
				f, r, pending = nf, bufio.NewReader(nf), nil
				continue
			}
		}
		if !running() {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
