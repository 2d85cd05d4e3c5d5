package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/urfave/cli/v2"
)

var updateDocs = flag.Bool("update-docs", false, "write docs/configuration.md from the commands' flags")

// TestConfigurationDoc: docs/configuration.md is the commands' flags as
// the binary defines them, so that it cannot drift from them; `go test
// -run TestConfigurationDoc -update-docs .` writes it again.
func TestConfigurationDoc(t *testing.T) {
	got := configurationDoc()
	if *updateDocs {
		if err := os.WriteFile("docs/configuration.md", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Fatal("docs/configuration.md is not the commands' flags: run `go test -run TestConfigurationDoc -update-docs .` and commit it")
	}
}

func configurationDoc() string {
	var b strings.Builder
	b.WriteString(`# Configuration: every command and flag

This page is made from the commands' own definitions (` + "`go test -run TestConfigurationDoc -update-docs .`" + `;
the test suite fails when it differs from them).

` + "`orch server`" + ` and ` + "`orch agent`" + ` read their flags also from
` + "`/etc/orch/config.yaml`" + ` (` + "`--config`" + `, ` + "`ORCH_CONFIG_FILE`" + `) and then
` + "`config.yaml.d/*.yaml`" + ` beside it, in k3s's format: keys are flag names, a list for
a repeated flag; the command line and ` + "`ORCH_*`" + ` variables win, and a key
that is no flag is an error:

` + "```yaml" + `
node-label: [zone=shed, board=pi4]
shutdown-grace-period: 1m
` + "```" + `
`)
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden {
				continue
			}
			name := path + " " + c.Name
			fmt.Fprintf(&b, "\n## `%s`\n\n%s.\n", name, strings.TrimSuffix(c.Usage, "."))
			if len(c.Flags) > 0 {
				b.WriteString("\n| flag | environment | default | what |\n| --- | --- | --- | --- |\n")
				for _, f := range c.Flags {
					d, ok := f.(cli.DocGenerationFlag)
					if !ok {
						continue
					}
					names := f.Names()
					flagName := "--" + names[0]
					if len(names[0]) == 1 {
						flagName = "-" + names[0]
					}
					def := d.GetDefaultText()
					if def == "" && d.TakesValue() {
						def = d.GetValue()
					}
					flagName = "`" + flagName + "`"
					if s, ok := f.(cli.DocGenerationSliceFlag); ok && s.IsSliceFlag() {
						flagName += " (repeatable)"
					}
					env := ""
					if e := d.GetEnvVars(); len(e) > 0 {
						env = "`" + strings.Join(e, "`, `") + "`"
					}
					if def != "" {
						def = "`" + strings.Trim(def, `"`) + "`"
					}
					fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", flagName, env, def, strings.ReplaceAll(d.GetUsage(), "|", `\|`))
				}
			}
			walk(name, c.Subcommands)
		}
	}
	walk("orch", appCommands())
	return b.String()
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// headingAnchors are the anchors GitHub gives a page's headings: lower
// case, spaces as hyphens, punctuation dropped.
func headingAnchors(page string) []string {
	var out []string
	for line := range strings.Lines(page) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// TestDocsLinks: every link in README.md and docs/ leads to a file of the
// repository, and to a heading there when it names one (README names
// nothing outside the repository).
func TestDocsLinks(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	pages = append(pages, "README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		body, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(body), -1) {
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") {
				if page == "README.md" {
					t.Errorf("%s links outside the repository: %s", page, target)
				}
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			linked, err := os.ReadFile(path)
			if err != nil && !isDir(path) {
				t.Errorf("%s links to %s, which is not there", page, target)
				continue
			}
			if anchor != "" && !slices.Contains(headingAnchors(string(linked)), anchor) {
				t.Errorf("%s links to %s: no such heading in %s", page, target, path)
			}
		}
	}
}
