package pods

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/containerd/containerd/cio"

	"github.com/orch-dev/orch/internal/agent/logs"
)

// outputBufferSize is what each stream's copier reads at a time. cio's
// own copier holds a pooled 32 KiB buffer per stream for as long as the
// container runs (2 MiB of heap for 30 pods, on a 512 MB board); the FIFO
// already buffers 64 KiB in the kernel, so a chatty container only costs
// more, smaller reads.
const outputBufferSize = 4 << 10

// containerIO is a container's FIFOs: its stdout and stderr (one stream
// for a terminal) copied into its log and to whoever is attached, and,
// for a container with stdin, the writing end of its stdin.
type containerIO struct {
	*cio.DirectIO
	copied sync.WaitGroup

	mu       sync.Mutex
	attached map[*attachment]bool
	// stdinClosed is set once the container's stdin was closed for good
	// (stdinOnce, after the first attach's input ended).
	stdinClosed bool
}

// attachment is one kubectl attach session's output.
type attachment struct{ stdout, stderr io.Writer }

// Wait returns once both streams have ended (the container's process and
// everything holding its output have exited) or the FIFOs are closed.
func (o *containerIO) Wait() { o.copied.Wait() }

// detach closes the agent's ends of the FIFOs and waits for the copying to
// end. Unlike Close it leaves the FIFOs in place: the shim holds their
// other ends for the next agent to reattach to.
func (o *containerIO) detach() {
	_ = o.Stdout.Close()
	if o.Stderr != nil {
		_ = o.Stderr.Close()
	}
	if o.Stdin != nil {
		_ = o.Stdin.Close()
	}
	o.copied.Wait()
}

// streams says what a container's FIFOs carry.
type streams struct{ stdin, tty bool }

// newContainerIO creates a new container's FIFOs in dir and copies what
// comes through them to lw.
func newContainerIO(dir string, lw *logs.Writer, s streams) cio.Creator {
	return func(id string) (cio.IO, error) {
		fifos, err := cio.NewFIFOSetInDir(dir, id, s.tty)
		if err != nil {
			return nil, err
		}
		return openContainerIO(fifos, lw, s)
	}
}

// reattachContainerIO reopens a running container's FIFOs, which its shim
// kept through an agent restart, and copies them to lw again.
func reattachContainerIO(lw *logs.Writer, s streams) cio.Attach {
	return func(fifos *cio.FIFOSet) (cio.IO, error) {
		if fifos == nil {
			return nil, errors.New("the task has no FIFOs to reattach to")
		}
		return openContainerIO(fifos, lw, s)
	}
}

func openContainerIO(fifos *cio.FIFOSet, lw *logs.Writer, s streams) (cio.IO, error) {
	if !s.stdin {
		fifos.Stdin = ""
	}
	dio, err := cio.NewDirectIO(context.Background(), fifos)
	if err != nil {
		return nil, err
	}
	o := &containerIO{DirectIO: dio, attached: map[*attachment]bool{}}
	o.copy(dio.Stdout, lw.Stdout(), func(a *attachment) io.Writer { return a.stdout })
	if !fifos.Terminal {
		o.copy(dio.Stderr, lw.Stderr(), func(a *attachment) io.Writer { return a.stderr })
	}
	return o, nil
}

// copy copies one output stream to the log and to the attached sessions
// that want it. It ends when the container's output closes, or when its
// FIFOs or log file are closed on stop.
func (o *containerIO) copy(from io.ReadCloser, log io.Writer, stream func(*attachment) io.Writer) {
	o.copied.Add(1)
	go func() {
		defer o.copied.Done()
		defer func() { _ = from.Close() }()
		buf := make([]byte, outputBufferSize)
		for {
			n, err := from.Read(buf)
			if n > 0 {
				if _, werr := log.Write(buf[:n]); werr != nil {
					return
				}
				o.mu.Lock()
				for a := range o.attached {
					if w := stream(a); w != nil {
						// A session that cannot keep up or went away
						// stops getting output; the log still does.
						if _, werr := w.Write(buf[:n]); werr != nil {
							delete(o.attached, a)
						}
					}
				}
				o.mu.Unlock()
			}
			if err != nil {
				// The output ended: a last line without its newline is
				// logged too.
				if f, ok := log.(interface{ Flush() error }); ok {
					_ = f.Flush()
				}
				return
			}
		}
	}()
}

// attach sends the container's output to stdout and stderr (either may be
// nil) until the returned detach is called.
func (o *containerIO) attach(stdout, stderr io.Writer) (detach func()) {
	a := &attachment{stdout: stdout, stderr: stderr}
	o.mu.Lock()
	o.attached[a] = true
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		delete(o.attached, a)
		o.mu.Unlock()
	}
}

// errNoStdin is attaching input to a container that has none, or whose
// stdin (stdinOnce) was already used and closed.
var errNoStdin = errors.New("the container's stdin is closed")

// input copies in to the container's stdin until in ends or ctx does.
// With once (the container's stdinOnce), the container's stdin is then
// closed for good, so that the process reads its end.
func (o *containerIO) input(ctx context.Context, in io.Reader, once bool) error {
	o.mu.Lock()
	stdin, closed := o.Stdin, o.stdinClosed
	o.mu.Unlock()
	if stdin == nil || closed {
		return errNoStdin
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(stdin, in)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if once {
		o.mu.Lock()
		o.stdinClosed = true
		o.mu.Unlock()
		return stdin.Close()
	}
	return nil
}
