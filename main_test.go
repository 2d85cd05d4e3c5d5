package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"orch", "version"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "orch version "+version+" ") {
		t.Fatalf("version printed %q", out.String())
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"orch", "no-such-command"}, &out)
	if err == nil || !strings.Contains(err.Error(), "no-such-command") {
		t.Fatalf("unknown command: error %v, want one naming it", err)
	}
}
