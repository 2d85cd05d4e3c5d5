package pods

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// cgroupRoot is where cgroup file systems are mounted; tests point it
// elsewhere.
var cgroupRoot = "/sys/fs/cgroup"

// orphanCgroupAge is how old an empty, unknown container cgroup must be
// before it is removed: runc makes a container's cgroup a moment before it
// moves the container's first process in.
const orphanCgroupAge = time.Minute

// removeOrphanCgroups removes the cgroups containerd made for containers
// (under "orch/", the parent it names after orch's namespace, in every
// hierarchy: cgroup v2's one or v1's several) that no container has any
// more: left when a run was killed with its shims, so runc never deleted
// them, hundreds after many such runs. Only a cgroup that holds no process,
// is of no container containerd knows and is older than minAge goes; the
// kubelet removes orphaned pod cgroups alike. It returns how many it
// removed.
func removeOrphanCgroups(known map[string]bool, minAge time.Duration) (int, error) {
	parents, err := filepath.Glob(filepath.Join(cgroupRoot, "orch"))
	if err != nil {
		return 0, err
	}
	more, err := filepath.Glob(filepath.Join(cgroupRoot, "*", "orch"))
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, parent := range append(parents, more...) {
		entries, err := os.ReadDir(parent)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading %s: %w", parent, err))
			continue
		}
		for _, e := range entries {
			if !e.IsDir() || known[e.Name()] {
				continue
			}
			dir := filepath.Join(parent, e.Name())
			gone, err := removeIfOrphan(dir, minAge)
			if err != nil {
				errs = append(errs, err)
			}
			if gone {
				removed++
			}
		}
	}
	return removed, errors.Join(errs...)
}

// removeIfOrphan removes the cgroup dir when it and every cgroup below it
// hold no process and it is older than minAge.
func removeIfOrphan(dir string, minAge time.Duration) (bool, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return false, nil // gone meanwhile
	}
	if time.Since(info.ModTime()) < minAge {
		return false, nil
	}
	var children []string // deepest last
	busy := false
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		procs, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("reading the processes of cgroup %s: %w", path, err)
		}
		if len(bytes.TrimSpace(procs)) > 0 {
			busy = true
			return filepath.SkipAll
		}
		children = append(children, path)
		return nil
	})
	if err != nil || busy {
		return false, err
	}
	// A cgroup's directory goes with rmdir alone (its files are the
	// kernel's), children before their parent.
	for i := len(children) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(children[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("removing orphaned cgroup %s: %w", children[i], err)
		}
	}
	return true, nil
}
