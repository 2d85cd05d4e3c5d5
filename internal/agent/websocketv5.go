package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/streaming/pkg/httpstream/wsstream"
	utilexec "k8s.io/utils/exec"
)

// execProtocolV5 is the websocket protocol kubectl (1.30 and later) asks
// for first, for exec and attach: v4's channels plus a signal closing
// stdin. The kubelet's library serves websockets only up to v4
// (kube-apiserver translates v5 to SPDY for it), so the agent serves v5
// itself rather than make kubectl fall back to SPDY every time.
const execProtocolV5 = "v5.channel.k8s.io"

// The channels of the remote command protocol.
const (
	stdinChannel = iota
	stdoutChannel
	stderrChannel
	errorChannel
	resizeChannel
)

// remoteCommand is an exec or an attach, given the session's streams.
type remoteCommand func(stdin io.Reader, stdout, stderr io.WriteCloser, resize <-chan remotecommand.TerminalSize) error

// websocketV5 serves an exec or attach over a v5 websocket.
func (a *kubeletAPI) websocketV5(w http.ResponseWriter, r *http.Request, opts *remotecommand.Options, run remoteCommand) {
	channel := func(on bool, t wsstream.ChannelType) wsstream.ChannelType {
		if on {
			return t
		}
		return wsstream.IgnoreChannel
	}
	channels := []wsstream.ChannelType{
		stdinChannel:  channel(opts.Stdin, wsstream.ReadChannel),
		stdoutChannel: channel(opts.Stdout, wsstream.WriteChannel),
		stderrChannel: channel(opts.Stderr, wsstream.WriteChannel),
		errorChannel:  wsstream.WriteChannel,
		resizeChannel: channel(opts.TTY, wsstream.ReadChannel),
	}
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{execProtocolV5: {Binary: true, Channels: channels}})
	conn.SetIdleTimeout(streamIdle)
	_, streams, err := conn.Open(w, r)
	if err != nil {
		a.log.Warn("remote command websocket", "err", err)
		return
	}
	defer func() { _ = conn.Close() }()
	// An empty message on the first writable channel tells the client the
	// streams are up.
	switch {
	case opts.Stdout:
		_, _ = streams[stdoutChannel].Write(nil)
	case opts.Stderr:
		_, _ = streams[stderrChannel].Write(nil)
	default:
		_, _ = streams[errorChannel].Write(nil)
	}
	var stdin io.Reader
	var stdout, stderr io.WriteCloser
	if opts.Stdin {
		stdin = streams[stdinChannel]
	}
	if opts.Stdout {
		stdout = streams[stdoutChannel]
	}
	if opts.Stderr {
		stderr = streams[stderrChannel]
	}
	var resize chan remotecommand.TerminalSize
	if opts.TTY {
		resize = make(chan remotecommand.TerminalSize)
		go func() {
			defer close(resize)
			dec := json.NewDecoder(streams[resizeChannel])
			for {
				var size remotecommand.TerminalSize
				if dec.Decode(&size) != nil {
					return
				}
				select {
				case resize <- size:
				case <-r.Context().Done():
					return
				}
			}
		}()
	}
	status, _ := json.Marshal(execStatus(run(stdin, stdout, stderr, resize)))
	_, _ = streams[errorChannel].Write(status)
}

// execStatus is how the protocol reports the command's end: Success, or
// NonZeroExitCode with the code as a cause, as the kubelet does.
func execStatus(err error) metav1.Status {
	if err == nil {
		return metav1.Status{Status: metav1.StatusSuccess}
	}
	var exitErr utilexec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		code := exitErr.ExitStatus()
		return metav1.Status{Status: metav1.StatusFailure, Reason: "NonZeroExitCode",
			Message: fmt.Sprintf("command terminated with non-zero exit code: %v", err),
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "ExitCode", Message: strconv.Itoa(code)}}}}
	}
	return metav1.Status{Status: metav1.StatusFailure, Message: fmt.Sprintf("error executing command in container: %v", err)}
}
