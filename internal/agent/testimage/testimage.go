// Package testimage builds container images for tests without a registry:
// an OCI image layout in a tarball, holding Debian's static busybox with
// the applet links a test shell needs. The agent imports it like any
// tarball a user drops into DATA/agent/images.
package testimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Busybox is where Debian's busybox-static puts the binary.
const Busybox = "/bin/busybox"

// applets are linked to busybox in /bin.
var applets = []string{"sh", "sleep", "echo", "cat", "ls", "true", "false", "env", "hostname", "wget", "nc", "id", "ps", "mkdir", "touch", "test", "httpd", "head", "tail", "grep", "rm", "stat", "wc", "tr", "chmod"}

// Image is an OCI image's parts: its manifest, config and single layer.
type Image struct {
	Manifest, Config, Layer []byte
}

// Blob is the content with the given digest, if the image has it.
func (img Image) Blob(d string) ([]byte, bool) {
	for _, b := range [][]byte{img.Manifest, img.Config, img.Layer} {
		if digest(b) == d {
			return b, true
		}
	}
	return nil, false
}

// ManifestDigest is the manifest's digest.
func (img Image) ManifestDigest() string { return digest(img.Manifest) }

// Config is what an image's config says to run: Entrypoint, then Cmd
// (which a container's args replace).
type Config struct {
	Entrypoint, Cmd []string
	// Files are more executables, by path in the image (a static test
	// program beside busybox).
	Files map[string][]byte
}

// BuildBusybox builds a busybox image that runs cmd.
func BuildBusybox(cmd ...string) (Image, error) {
	return Build(Config{Cmd: cmd})
}

// Build builds a busybox image with the given config.
func Build(cfg Config) (Image, error) {
	bin, err := os.ReadFile(Busybox)
	if err != nil {
		return Image{}, fmt.Errorf("test images need busybox-static (apt install busybox-static): %w", err)
	}
	layer, err := tarOf(func(w *tar.Writer) error {
		mtime := time.Unix(0, 0)
		for _, dir := range []string{"bin/", "tmp/", "etc/"} {
			if err := w.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		if err := w.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: mtime}); err != nil {
			return err
		}
		if _, err := w.Write(bin); err != nil {
			return err
		}
		for _, a := range applets {
			if err := w.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
				return err
			}
		}
		for _, name := range slices.Sorted(maps.Keys(cfg.Files)) {
			data := cfg.Files[name]
			if err := w.WriteHeader(&tar.Header{Name: strings.TrimPrefix(name, "/"), Mode: 0o755, Size: int64(len(data)), ModTime: mtime}); err != nil {
				return err
			}
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Image{}, err
	}
	layerDigest := digest(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": cfg.Entrypoint, "Cmd": cfg.Cmd, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return Image{}, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers": []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer)},
	})
	if err != nil {
		return Image{}, err
	}
	return Image{Manifest: manifest, Config: config, Layer: layer}, nil
}

// WriteBusybox writes an OCI image tarball named name (e.g.
// "docker.io/library/busybox:test") to path; the image runs cmd.
func WriteBusybox(path, name string, cmd ...string) error {
	return Write(path, name, Config{Cmd: cmd})
}

// Write writes an OCI image tarball of a busybox image with the given
// config, named name, to path.
func Write(path, name string, cfg Config) error {
	img, err := Build(cfg)
	if err != nil {
		return err
	}
	manifest, config, layer := img.Manifest, img.Config, img.Layer
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
	md["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []any{md}})
	if err != nil {
		return err
	}
	archive, err := tarOf(func(w *tar.Writer) error {
		files := []struct {
			name string
			data []byte
		}{
			{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
			{"index.json", index},
			{blobPath(layer), layer},
			{blobPath(config), config},
			{blobPath(manifest), manifest},
		}
		for _, f := range files {
			if err := w.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
			if _, err := w.Write(f.data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.WriteFile(path, archive, 0o644)
}

func tarOf(fill func(*tar.Writer) error) ([]byte, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	if err := fill(w); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(data []byte) string {
	sum := sha256.Sum256(data)
	return "blobs/sha256/" + hex.EncodeToString(sum[:])
}

func descriptor(mediaType string, data []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(data), "size": len(data)}
}
