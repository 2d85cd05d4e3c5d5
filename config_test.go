package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// configApp is a command with orch's config handling and a few flags of
// each kind, reporting what it ended up with.
func configApp(got *cli.Context) *cli.App {
	return &cli.App{Name: "orch", Writer: &bytes.Buffer{}, ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{{
			Name: "agent",
			Flags: append([]cli.Flag{
				&cli.StringFlag{Name: "server", EnvVars: []string{"ORCH_URL"}},
				&cli.StringSliceFlag{Name: "node-label", EnvVars: []string{"ORCH_NODE_LABEL"}},
				&cli.BoolFlag{Name: "disable-agent"},
				&cli.IntFlag{Name: "kubelet-port", Value: 10250},
			}, processFlags()...),
			Before: loadConfigFile,
			Action: func(c *cli.Context) error { *got = *c; return nil },
		}},
	}
}

// TestConfigFile: flags' values come from the config file and its
// drop-ins unless the command line or an ORCH_* variable gives them, as
// with k3s.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(file, "server: https://from-file:6443\nnode-label: [zone=a, disk=ssd]\ndisable-agent: true\nkubelet-port: 10260\nlog-format: json\n")
	write(filepath.Join(dir, "config.yaml.d", "10-port.yaml"), "kubelet-port: 10270\n")
	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		server     string
		labels     []string
		port       int
		wantErrSub string
	}{
		{name: "from the file and its drop-in", args: nil, server: "https://from-file:6443", labels: []string{"zone=a", "disk=ssd"}, port: 10270},
		{name: "the command line wins", args: []string{"--server", "https://from-flag:6443", "--node-label", "zone=b"}, server: "https://from-flag:6443", labels: []string{"zone=b"}, port: 10270},
		{name: "the environment wins", env: map[string]string{"ORCH_URL": "https://from-env:6443"}, server: "https://from-env:6443", labels: []string{"zone=a", "disk=ssd"}, port: 10270},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var got cli.Context
			args := append([]string{"orch", "agent", "--config", file}, tc.args...)
			if err := configApp(&got).RunContext(context.Background(), args); err != nil {
				t.Fatal(err)
			}
			if got.String("server") != tc.server || !slices.Equal(got.StringSlice("node-label"), tc.labels) || got.Int("kubelet-port") != tc.port ||
				!got.Bool("disable-agent") || got.String("log-format") != "json" {
				t.Errorf("server %q labels %v port %d disable-agent %v log-format %q", got.String("server"), got.StringSlice("node-label"),
					got.Int("kubelet-port"), got.Bool("disable-agent"), got.String("log-format"))
			}
		})
	}
	for _, tc := range []struct{ name, content, want string }{
		{"a key that is no flag", "sever: https://typo:6443\n", `"sever" is not a flag of orch agent`},
		{"a value of the wrong kind", "kubelet-port: lots\n", "kubelet-port"},
		{"not YAML", "server: [\n", "config file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "config.yaml")
			write(bad, tc.content)
			var got cli.Context
			err := configApp(&got).RunContext(context.Background(), []string{"orch", "agent", "--config", bad})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
	t.Run("the default file may be missing, a named one may not", func(t *testing.T) {
		var got cli.Context
		app := configApp(&got)
		// The default, pointed at a file this machine does not have.
		for _, f := range app.Commands[0].Flags {
			if sf, ok := f.(*cli.StringFlag); ok && sf.Name == "config" {
				sf.Value = filepath.Join(dir, "no-such-default.yaml")
			}
		}
		if err := app.RunContext(context.Background(), []string{"orch", "agent"}); err != nil {
			t.Errorf("without the default config file: %v", err)
		}
		err := configApp(&got).RunContext(context.Background(), []string{"orch", "agent", "--config", filepath.Join(dir, "absent.yaml")})
		if err == nil || !strings.Contains(err.Error(), "absent.yaml") {
			t.Errorf("a named file missing: %v", err)
		}
	})
}

func TestLogFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-format", "xml"}, `--log-format "xml": text or json`},
		{[]string{"--v", "-1"}, "verbosity is 0 or more"},
	} {
		var got cli.Context
		if err := configApp(&got).RunContext(context.Background(), append([]string{"orch", "agent", "--config", os.DevNull}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if _, err := newLogger(&got); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	var got cli.Context
	if err := configApp(&got).RunContext(context.Background(), []string{"orch", "agent", "--config", os.DevNull, "--v", "4"}); err != nil {
		t.Fatal(err)
	}
	log, err := newLogger(&got)
	if err != nil || !log.Enabled(context.Background(), -4) || log.Enabled(context.Background(), -5) {
		t.Errorf("-v 4 should log debug (slog level -4) and no finer: %v", err)
	}
}
