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

func TestAgentFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"orch", "agent"}, "needs --server"},
		{[]string{"orch", "agent", "--server", "http://x:6443", "--token", "t"}, "want https://"},
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-taint", "gpu=yes"}, "want key=value:Effect"},
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-taint", "gpu=yes:Sometimes"}, "effect must be"},
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-label", "novalue"}, "want key=value"},
	} {
		err := run(context.Background(), tt.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want %q", tt.args[2:], err, tt.want)
		}
	}
}

func TestTaintsParse(t *testing.T) {
	got, err := parseTaints([]string{"dedicated=gpu:NoSchedule", "edge:PreferNoSchedule"})
	if err != nil || len(got) != 2 || got[0].Key != "dedicated" || got[0].Value != "gpu" || got[0].Effect != "NoSchedule" || got[1].Value != "" {
		t.Fatalf("%+v %v", got, err)
	}
}
