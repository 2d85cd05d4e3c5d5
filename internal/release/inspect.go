package release

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
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
	// it did not, as `orch version` says); "" when Inspect cannot tell
	// (a -trimpath build keeps no -ldflags) and the binary was not run.
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
	info, err := readBuildInfo(path)
	if err != nil {
		return Binary{}, fmt.Errorf("%s is no Go binary: %w", path, err)
	}
	if info.Main.Path != Module {
		return Binary{}, fmt.Errorf("%s is not orch: it was built from %q", path, info.Main.Path)
	}
	var b Binary
	goos, goarch := "", ""
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		case "-ldflags":
			b.Version, b.Commit = ldflagValue(s.Value, "main.version"), ldflagValue(s.Value, "main.commit")
			if b.Version == "" {
				b.Version = DevVersion
			}
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

// Verify is Inspect and the binary's own word: `orch version` must run
// and name the version and platform its build says. A binary for another
// architecture is run too where this machine can (binfmt); where it
// cannot, its version is what its build recorded, or "" when the build
// recorded none (-trimpath builds do not keep -ldflags): the caller takes
// it from the release's binary for this machine (Store.Add's hint).
// want, when not empty, is the platform the binary must be for.
func Verify(ctx context.Context, path, want string) (Binary, error) {
	b, err := Inspect(path)
	if err != nil {
		return Binary{}, err
	}
	if want != "" && b.Platform != want {
		return Binary{}, fmt.Errorf("%s is built for %s, not %s", path, b.Platform, want)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "version")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if b.Platform != Platform() && out.Len() == 0 {
			return b, nil // another architecture's, which this machine cannot run
		}
		return Binary{}, fmt.Errorf("%s does not run `orch version`: %w: %s", path, err, strings.TrimSpace(out.String()))
	}
	said := strings.TrimSpace(out.String())
	v, rest, ok := strings.Cut(strings.TrimPrefix(said, "orch version "), " ")
	switch {
	case !strings.HasPrefix(said, "orch version ") || !ok:
		return Binary{}, fmt.Errorf("%s says %q, not orch version VERSION", path, said)
	case b.Version != "" && v != b.Version:
		return Binary{}, fmt.Errorf("%s says it is orch %s, its build says %s", path, v, b.Version)
	case !strings.HasSuffix(rest, b.Platform+")"):
		return Binary{}, fmt.Errorf("%s says %q, not a build for %s", path, said, b.Platform)
	}
	b.Version = v
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

// buildInfoMagic starts the block of build information the Go linker
// writes (the .go.buildinfo section), at a 16-byte boundary.
var buildInfoMagic = []byte("\xff Go buildinf:")

// readBuildInfo is debug/buildinfo.ReadFile for the binaries Go has made
// since 1.18 (their strings inline), found by a scan of the file instead
// of its executable format: debug/buildinfo links the readers of every
// format Go writes (ELF, Mach-O, PE, XCOFF, Plan 9: 0.8 MB of orch).
func readBuildInfo(path string) (*debug.BuildInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	r := bufio.NewReaderSize(f, 64<<10)
	header := make([]byte, 32)
	for {
		if _, err := io.ReadFull(r, header[:16]); err != nil {
			return nil, errors.New("no Go build information found")
		}
		if !bytes.Equal(header[:14], buildInfoMagic[:14]) {
			continue
		}
		if _, err := io.ReadFull(r, header[16:]); err != nil {
			return nil, errors.New("truncated Go build information")
		}
		if header[15]&0x2 == 0 {
			return nil, errors.New("built by a Go before 1.18")
		}
		if _, err := readVarString(r); err != nil { // the Go version
			return nil, err
		}
		mod, err := readVarString(r)
		if err != nil {
			return nil, err
		}
		// The module information is framed by 16-byte sentinels.
		if len(mod) < 33 {
			return nil, errors.New("no module information: not built in module mode")
		}
		return debug.ParseBuildInfo(mod[16 : len(mod)-16])
	}
}

func readVarString(r *bufio.Reader) (string, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil || n > 1<<20 {
		return "", errors.New("corrupt Go build information")
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", errors.New("truncated Go build information")
	}
	return string(b), nil
}
