package release

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// Module is orch's Go module: a binary built from another is no release.
const Module = "github.com/orch-dev/orch"

// Binary is what a release binary says it is.
type Binary struct {
	// Version is main.version as the build stamped it (v0.0.0-dev when
	// it did not, as `orch version` says).
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	// Platform is OCI's name of what it runs on: linux/arm64,
	// linux/arm/v6.
	Platform string `json:"platform"`
}

// DevVersion is the version of a build that was given none.
const DevVersion = "v0.0.0-dev"

// Platform is what this process runs on, as OCI names platforms: with the
// ARM version for 32-bit ARM (linux/arm/v6 for a Raspberry Pi Zero's
// build, linux/arm/v7 for armhf's), which a board's release must match.
func Platform() string {
	info, _ := debug.ReadBuildInfo()
	return platformOf(runtime.GOOS, runtime.GOARCH, info)
}

func platformOf(goos, goarch string, info *debug.BuildInfo) string {
	p := goos + "/" + goarch
	if goarch != "arm" {
		return p
	}
	goarm := "7" // Go's default for GOARCH=arm on linux since 1.22
	if info != nil {
		for _, s := range info.Settings {
			if s.Key == "GOARM" {
				goarm = strings.SplitN(s.Value, ",", 2)[0]
			}
		}
	}
	return p + "/v" + goarm
}

// Inspect reads what the binary at path is from the build information Go
// puts in every binary, without running it (it may be another
// architecture's).
func Inspect(path string) (Binary, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return Binary{}, fmt.Errorf("%s is no Go binary: %w", path, err)
	}
	if info.Main.Path != Module {
		return Binary{}, fmt.Errorf("%s is not orch: it was built from %q", path, info.Main.Path)
	}
	b := Binary{Version: DevVersion}
	goos, goarch := "", ""
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		case "-ldflags":
			if v := ldflagValue(s.Value, "main.version"); v != "" {
				b.Version = v
			}
			b.Commit = ldflagValue(s.Value, "main.commit")
		}
	}
	if goos != "linux" || goarch == "" {
		return Binary{}, fmt.Errorf("%s is built for %s/%s: orch releases are for linux", path, goos, goarch)
	}
	b.Platform = platformOf(goos, goarch, info)
	return b, nil
}

// ldflagValue is what -X name=value set in a build's -ldflags.
func ldflagValue(ldflags, name string) string {
	fields := strings.Fields(ldflags)
	for i, f := range fields {
		var set string
		switch {
		case f == "-X" && i+1 < len(fields):
			set = fields[i+1]
		case strings.HasPrefix(f, "-X="):
			set = strings.TrimPrefix(f, "-X=")
		default:
			continue
		}
		if v, ok := strings.CutPrefix(strings.Trim(set, `'"`), name+"="); ok {
			return v
		}
	}
	return ""
}

// Verify is Inspect and, where this machine can run the binary, its own
// word: `orch version` must run and name the same version and platform.
// want, when not empty, is the platform the binary must be for.
func Verify(ctx context.Context, path, want string) (Binary, error) {
	b, err := Inspect(path)
	if err != nil {
		return Binary{}, err
	}
	if want != "" && b.Platform != want {
		return Binary{}, fmt.Errorf("%s is built for %s, not %s", path, b.Platform, want)
	}
	if b.Platform != Platform() {
		return b, nil // another architecture's: its build information says what it is
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "version")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return Binary{}, fmt.Errorf("%s does not run `orch version` here: %w: %s", path, err, strings.TrimSpace(out.String()))
	}
	said := strings.TrimSpace(out.String())
	if !strings.HasPrefix(said, "orch version "+b.Version+" ") || !strings.Contains(said, b.Platform+")") {
		return Binary{}, fmt.Errorf("%s says %q, not orch version %s for %s", path, said, b.Version, b.Platform)
	}
	return b, nil
}

// AssetPlatform is the platform a release asset's name stands for, as
// scripts/release.sh names them (orch for amd64, orch-arm64, orch-armhf,
// orch-armv6); "" for a name that is no release asset's.
func AssetPlatform(name string) string {
	switch name {
	case "orch":
		return "linux/amd64"
	case "orch-arm64":
		return "linux/arm64"
	case "orch-armhf":
		return "linux/arm/v7"
	case "orch-armv6":
		return "linux/arm/v6"
	}
	return ""
}
