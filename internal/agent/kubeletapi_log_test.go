package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// TestStreamLibraryLogsAtDebug: what the streaming library logs as an
// error through a session's request (its socket closed when kubectl exec
// ends) reaches the agent's log at debug level only.
func TestStreamLibraryLogsAtDebug(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var buf bytes.Buffer
		ctx := klog.NewContext(context.Background(), logr.FromSlogHandler(debugLevel{slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})}))
		klog.FromContext(ctx).Error(errors.New("use of closed network connection"), "Error on socket receive")
		switch got := buf.String(); {
		case level == slog.LevelInfo && got != "":
			t.Errorf("at info level the agent logged %q", got)
		case level == slog.LevelDebug && !strings.Contains(got, "level=DEBUG"):
			t.Errorf("at debug level the agent logged %q", got)
		}
	}
}
