package release

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// PreviousPath is where Install keeps the binary it replaced.
func PreviousPath(exe string) string { return exe + ".previous" }

// Install makes the file at next, in exe's directory, the binary at exe,
// keeping the one it replaces at PreviousPath(exe). Every step is a
// rename or a link, so a crash at any point leaves exe whole: the old
// binary or the new one, never none or half of one.
func Install(exe, next string) error {
	if filepath.Dir(next) != filepath.Dir(exe) {
		return fmt.Errorf("install %s: %s must be in the same directory to replace it atomically", exe, next)
	}
	if err := os.Chmod(next, 0o755); err != nil {
		return fmt.Errorf("install %s: %w", exe, err)
	}
	prev := PreviousPath(exe)
	if err := keepCopy(exe, prev); err != nil {
		return fmt.Errorf("install %s: keep the running binary: %w", exe, err)
	}
	if err := os.Rename(next, exe); err != nil {
		return fmt.Errorf("install %s: %w", exe, err)
	}
	return syncDir(filepath.Dir(exe))
}

// Restore puts the binary Install kept back at exe (and keeps it where it
// was too).
func Restore(exe string) error {
	prev := PreviousPath(exe)
	if _, err := os.Stat(prev); err != nil {
		return fmt.Errorf("restore %s: no previous binary: %w", exe, err)
	}
	tmp := exe + ".restore"
	if err := keepCopy(prev, tmp); err != nil {
		return fmt.Errorf("restore %s: %w", exe, err)
	}
	if err := os.Rename(tmp, exe); err != nil {
		return fmt.Errorf("restore %s: %w", exe, err)
	}
	return syncDir(filepath.Dir(exe))
}

// keepCopy makes dst the same file as src: a hard link (no bytes
// written), a copy where the file system has none; dst appears whole.
func keepCopy(src, dst string) error {
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		if err := copyPlain(src, tmp); err != nil {
			_ = os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

func copyPlain(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}
