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

// logOutput is a container's stdout and stderr FIFOs, copied into its log.
type logOutput struct {
	*cio.DirectIO
	copied sync.WaitGroup
}

// Wait returns once both streams have ended (the container's process and
// everything holding its output have exited) or the FIFOs are closed.
func (o *logOutput) Wait() { o.copied.Wait() }

// detach closes the agent's ends of the FIFOs and waits for the copying to
// end. Unlike Close it leaves the FIFOs in place: the shim holds their
// other ends for the next agent to reattach to.
func (o *logOutput) detach() {
	_ = o.Stdout.Close()
	_ = o.Stderr.Close()
	o.copied.Wait()
}

// outputToLog creates a new container's FIFOs in dir and copies what comes
// through them to lw.
func outputToLog(dir string, lw *logs.Writer) cio.Creator {
	return func(id string) (cio.IO, error) {
		fifos, err := cio.NewFIFOSetInDir(dir, id, false)
		if err != nil {
			return nil, err
		}
		return copyToLog(fifos, lw)
	}
}

// reattachToLog reopens a running container's FIFOs, which its shim kept
// through an agent restart, and copies them to lw again.
func reattachToLog(lw *logs.Writer) cio.Attach {
	return func(fifos *cio.FIFOSet) (cio.IO, error) {
		if fifos == nil {
			return nil, errors.New("the task has no FIFOs to reattach to")
		}
		return copyToLog(fifos, lw)
	}
}

func copyToLog(fifos *cio.FIFOSet, lw *logs.Writer) (cio.IO, error) {
	// Containers get no stdin (no kubectl attach), and never a terminal.
	fifos.Stdin, fifos.Terminal = "", false
	dio, err := cio.NewDirectIO(context.Background(), fifos)
	if err != nil {
		return nil, err
	}
	o := &logOutput{DirectIO: dio}
	for _, stream := range []struct {
		from io.ReadCloser
		to   io.Writer
	}{{dio.Stdout, lw.Stdout()}, {dio.Stderr, lw.Stderr()}} {
		o.copied.Add(1)
		go func() {
			defer o.copied.Done()
			// It ends when the container's output closes, or when its
			// FIFOs or log file are closed on stop.
			_, _ = io.CopyBuffer(stream.to, stream.from, make([]byte, outputBufferSize))
			_ = stream.from.Close()
		}()
	}
	return o, nil
}
