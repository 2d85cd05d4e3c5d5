package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"sigs.k8s.io/yaml"
)

// defaultConfigFile is where flags' values may be written instead of on
// the command line, as k3s's /etc/rancher/k3s/config.yaml.
const defaultConfigFile = "/etc/orch/config.yaml"

// processFlags are orch server's and orch agent's alike: the config file
// and how they log.
func processFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Value: defaultConfigFile, EnvVars: []string{"ORCH_CONFIG_FILE"},
			Usage: "YAML file of flag values (keys are flag names; a list for a repeated flag), and FILE.d/*.yaml after it; the command line and ORCH_* variables win over it"},
		&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"ORCH_LOG_FORMAT"}, Usage: "text (key=value) or json (one object a line, for journald and log shippers)"},
		&cli.IntFlag{Name: "v", Value: 0, EnvVars: []string{"ORCH_V"}, Usage: "log verbosity: 0 info and above; 1 to 4 debug; higher also client-go's detail (klog's -v)"},
	}
}

// newLogger is the process's logger as --log-format and -v say: -v n lets
// through slog level -n, which is also what klog's V(n) logs at.
func newLogger(c *cli.Context) (*slog.Logger, error) {
	v := c.Int("v")
	if v < 0 {
		return nil, fmt.Errorf("-v %d: verbosity is 0 or more", v)
	}
	opts := &slog.HandlerOptions{Level: slog.Level(-v)}
	switch format := c.String("log-format"); format {
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: text or json", format)
	}
}

// loadConfigFile sets every flag the command line and environment left
// unset from the config file and its drop-ins (FILE.d/*.yaml, in name
// order, later ones winning), as k3s does. A key that is no flag of the
// command is an error, so a typo does not pass unnoticed; the default file
// may be missing, a named one may not.
func loadConfigFile(c *cli.Context) error {
	path := c.String("config")
	values, err := readConfig(path)
	if errors.Is(err, fs.ErrNotExist) && !c.IsSet("config") {
		values, err = map[string]any{}, nil
	}
	if err != nil {
		return err
	}
	dropIns, _ := filepath.Glob(path + ".d/*.yaml")
	sort.Strings(dropIns)
	for _, f := range dropIns {
		more, err := readConfig(f)
		if err != nil {
			return err
		}
		for k, v := range more {
			values[k] = v
		}
	}
	names := map[string]bool{}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			names[n] = true
		}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		switch {
		case !names[key] || key == "config":
			return fmt.Errorf("%s: %q is not a flag of orch %s", path, key, c.Command.Name)
		case c.IsSet(key):
			continue // the command line or an ORCH_* variable said
		}
		for _, v := range configValues(values[key]) {
			if err := c.Set(key, v); err != nil {
				return fmt.Errorf("%s: %s: %w", path, key, err)
			}
		}
	}
	return nil
}

func readConfig(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	values := map[string]any{}
	if err := yaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return values, nil
}

// configValues are a YAML value as flag values: a list is the flag given
// once per item.
func configValues(v any) []string {
	switch v := v.(type) {
	case []any:
		var out []string
		for _, item := range v {
			out = append(out, configValues(item)...)
		}
		return out
	case nil:
		return nil
	case string:
		return []string{v}
	case bool:
		return []string{strconv.FormatBool(v)}
	case float64:
		return []string{strconv.FormatFloat(v, 'f', -1, 64)}
	default:
		return []string{strings.TrimSpace(fmt.Sprint(v))}
	}
}
