package containerd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
)

// Snapshotter unpacks images for containers.
const Snapshotter = "overlayfs"

// Importer imports the image tarballs (OCI layout or docker-archive, as
// `docker save` and `ctr export` write them) found in a directory, once
// each, at start and whenever one appears or changes.
type Importer struct {
	client *containerd.Client
	dir    string
	log    *slog.Logger
	seen   map[string]time.Time // file → modification time imported
}

// PinnedLabel marks images image garbage collection keeps (the CRI
// plugin's label for it).
const PinnedLabel = "io.cri-containerd.pinned"

// NewImporter imports from dir into client's orch namespace.
func NewImporter(client *containerd.Client, dir string, log *slog.Logger) *Importer {
	return &Importer{client: client, dir: dir, log: log.With("component", "images"), seen: map[string]time.Time{}}
}

// Run looks for new or changed tarballs every interval until ctx ends
// (Scan imports those there now). It must not run beside another Scan.
func (im *Importer) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := im.Scan(ctx); err != nil && ctx.Err() == nil {
			im.log.Warn("image import", "err", err)
		}
	}
}

// Scan imports the tarballs not imported yet and returns the names of the
// images they held.
func (im *Importer) Scan(ctx context.Context) ([]string, error) {
	if err := os.MkdirAll(im.dir, 0o755); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(im.dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() || !isTarball(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		path := filepath.Join(im.dir, e.Name())
		if at, ok := im.seen[path]; ok && at.Equal(info.ModTime()) {
			continue
		}
		imported, err := im.importFile(ctx, path)
		if err != nil {
			// A file still being copied in is tried again next time.
			im.log.Warn("image tarball not imported", "file", path, "err", err)
			continue
		}
		im.seen[path] = info.ModTime()
		names = append(names, imported...)
	}
	return names, nil
}

func isTarball(name string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.zst"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

func (im *Importer) importFile(ctx context.Context, path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	ctx = namespaces.WithNamespace(ctx, Namespace)
	images, err := im.client.Import(ctx, f, containerd.WithAllPlatforms(false))
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	var names []string
	for _, img := range images {
		// Pinned, as k3s pins its air-gap images: the node may have no
		// registry to pull them from again.
		if img.Labels == nil {
			img.Labels = map[string]string{}
		}
		img.Labels[PinnedLabel] = "pinned"
		if img, err = im.client.ImageService().Update(ctx, img, "labels."+PinnedLabel); err != nil {
			return nil, fmt.Errorf("pin %s: %w", img.Name, err)
		}
		image := containerd.NewImage(im.client, img)
		if err := image.Unpack(ctx, Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack %s from %s: %w", img.Name, path, err)
		}
		names = append(names, img.Name)
		im.log.Info("image imported", "image", img.Name, "file", path)
	}
	return names, nil
}
