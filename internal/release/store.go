package release

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/orch-dev/orch/internal/atomicfile"
)

// Release is one binary a server holds for its nodes.
type Release struct {
	Binary
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Store is the releases a server hands its nodes, one binary per version
// and platform: DIR/VERSION/PLATFORM (slashes as dashes)/orch with
// release.json beside it.
type Store struct{ Dir string }

// ErrNotStaged is a release the store does not hold.
var ErrNotStaged = errors.New("not staged")

func (s Store) dirOf(version, platform string) (string, error) {
	if !validName(version) || platform == "" || strings.Contains(platform, "..") {
		return "", fmt.Errorf("release %q for %q: %w", version, platform, ErrNotStaged)
	}
	return filepath.Join(s.Dir, version, strings.ReplaceAll(platform, "/", "-")), nil
}

// validName keeps a version a single path element.
func validName(v string) bool {
	return v != "" && v != "." && v != ".." && !strings.ContainsAny(v, `/\`) && len(v) <= 128
}

// Add verifies the binary at path and keeps a copy: sums, when not nil,
// are a release's sha256sum.txt, which must name the file (by its base
// name) with the sum it has. version is the release's version as its
// binary for this machine said, for a binary of another architecture
// whose own cannot be told ("" when none was). It returns what it keeps.
func (s Store) Add(ctx context.Context, path string, sums map[string]string, version string) (Release, error) {
	b, err := Verify(ctx, path, AssetPlatform(filepath.Base(path)))
	if err != nil {
		return Release{}, err
	}
	if b.Version == "" {
		if version == "" || sums == nil {
			return Release{}, fmt.Errorf("cannot tell which version %s is (a %s binary this machine cannot run, whose build does not say): stage it with its release's sha256sum.txt and the release's binary for %s", path, b.Platform, Platform())
		}
		b.Version = version
	}
	if !validName(b.Version) {
		return Release{}, fmt.Errorf("%s carries the version %q, which cannot name a release", path, b.Version)
	}
	sum, size, err := fileSHA256(path)
	if err != nil {
		return Release{}, err
	}
	if sums != nil {
		want, ok := sums[filepath.Base(path)]
		switch {
		case !ok:
			return Release{}, fmt.Errorf("the release's sha256sum.txt names no %s", filepath.Base(path))
		case want != sum:
			return Release{}, fmt.Errorf("%s's sha256 is %s, the release's sha256sum.txt says %s: the file is corrupt or not the release's", path, sum, want)
		}
	}
	dir, err := s.dirOf(b.Version, b.Platform)
	if err != nil {
		return Release{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Release{}, err
	}
	r := Release{Binary: b, SHA256: sum, Size: size}
	if err := copyFile(path, filepath.Join(dir, "orch"), sum); err != nil {
		return Release{}, err
	}
	meta, _ := json.Marshal(r)
	if err := atomicfile.Write(filepath.Join(dir, "release.json"), meta, 0o600); err != nil {
		return Release{}, err
	}
	return r, nil
}

// Get is the release of version for platform, with the path of its
// binary.
func (s Store) Get(version, platform string) (Release, string, error) {
	dir, err := s.dirOf(version, platform)
	if err != nil {
		return Release{}, "", err
	}
	data, err := os.ReadFile(filepath.Join(dir, "release.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Release{}, "", fmt.Errorf("orch %s for %s: %w (orch upgrade stage)", version, platform, ErrNotStaged)
	}
	if err != nil {
		return Release{}, "", err
	}
	var r Release
	if err := json.Unmarshal(data, &r); err != nil {
		return Release{}, "", fmt.Errorf("%s: %w", filepath.Join(dir, "release.json"), err)
	}
	return r, filepath.Join(dir, "orch"), nil
}

// List is every release the store holds, by version then platform.
func (s Store) List() ([]Release, error) {
	paths, err := filepath.Glob(filepath.Join(s.Dir, "*", "*", "release.json"))
	if err != nil {
		return nil, err
	}
	var out []Release
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var r Release
		if json.Unmarshal(data, &r) == nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Version != out[j].Version {
			return out[i].Version < out[j].Version
		}
		return out[i].Platform < out[j].Platform
	})
	return out, nil
}

// ReadSums reads a sha256sum.txt: "SUM  NAME" (or "SUM *NAME") per line.
func ReadSums(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	sums := map[string]string{}
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 || len(fields[0]) != sha256.Size*2 {
			continue
		}
		sums[strings.TrimPrefix(fields[1], "*")] = strings.ToLower(fields[0])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sums, nil
}

func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// copyFile copies src to dst whole or not at all, checking that what it
// wrote has the sum src had.
func copyFile(src, dst, sum string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		_ = tmp.Close()
		return fmt.Errorf("%s changed while it was copied", src)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
