package pods

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
)

// ImageGC is when unused images are removed, as the kubelet's image
// garbage collection does: once the filesystem holding them is more than
// HighPercent full, images no container uses are removed, least recently
// used first, until it is under LowPercent. Images used within MinAge,
// and pinned ones (those imported from the images directory, which an
// air-gapped node cannot pull again), are kept.
type ImageGC struct {
	HighPercent, LowPercent float64
	MinAge                  time.Duration
	// Every is how often the filesystem is checked.
	Every time.Duration
}

// withDefaults fills in the kubelet's defaults: 85 % and 80 %, images
// unused for two minutes, checked every five.
func (g ImageGC) withDefaults() ImageGC {
	if g.HighPercent == 0 && g.LowPercent == 0 {
		g.HighPercent, g.LowPercent = 85, 80
	}
	if g.MinAge == 0 {
		g.MinAge = 2 * time.Minute
	}
	if g.Every == 0 {
		g.Every = 5 * time.Minute
	}
	return g
}

// touchImage records that a pod wants ref now.
func (m *Manager) touchImage(ref string) {
	m.mu.Lock()
	m.imageUsed[ref] = time.Now()
	m.mu.Unlock()
}

// collectImagesEvery runs image garbage collection until ctx ends.
func (m *Manager) collectImagesEvery(ctx context.Context) {
	t := time.NewTicker(m.cfg.ImageGC.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := m.collectImages(ctx, false); err != nil && ctx.Err() == nil {
			m.log.Warn("image garbage collection", "err", err)
		}
	}
}

// collectImages removes unused images while the image filesystem is over
// the high threshold and until it is under the low one, and returns what
// it removed. Under disk pressure (all) it removes every unused image, as
// the kubelet reclaims the disk before evicting pods.
func (m *Manager) collectImages(ctx context.Context, all bool) ([]string, error) {
	gc := m.cfg.ImageGC
	if all {
		gc.HighPercent, gc.LowPercent = 0, 0
	}
	used, err := diskUsedPercent(m.cfg.DataDir)
	if err != nil || used < gc.HighPercent {
		return nil, err
	}
	cctx := m.ctx(ctx)
	containers, err := m.ctr.Containers(cctx, nil)
	if err != nil {
		return nil, err
	}
	inUse := map[string]bool{}
	for _, c := range containers {
		inUse[c.Image] = true
	}
	for _, ref := range m.imageVolumeRefs() {
		inUse[ref] = true
	}
	stored, err := m.ctr.Images(cctx)
	if err != nil {
		return nil, err
	}
	type candidate struct {
		name     string
		lastUsed time.Time
	}
	var candidates []candidate
	now := time.Now()
	m.mu.Lock()
	for _, img := range stored {
		lastUsed := img.CreatedAt
		if at, ok := m.imageUsed[img.Name]; ok && at.After(lastUsed) {
			lastUsed = at
		}
		if inUse[img.Name] || img.Labels[orchctr.PinnedLabel] == "pinned" || now.Sub(lastUsed) < gc.MinAge {
			continue
		}
		candidates = append(candidates, candidate{img.Name, lastUsed})
	}
	m.mu.Unlock()
	// sort.Slice, not slices.SortFunc: a generic sort of a struct type
	// costs the binary budget (design.md) some 12 KB.
	sort.Slice(candidates, func(i, j int) bool { return candidates[i].lastUsed.Before(candidates[j].lastUsed) })
	var removed []string
	for _, c := range candidates {
		if used < gc.LowPercent {
			break
		}
		// Synchronous: containerd's own collection frees the layers and
		// their unpacked snapshots before the disk is measured again.
		if err := m.ctr.RemoveImage(cctx, c.name); err != nil {
			return removed, fmt.Errorf("remove image %s: %w", c.name, err)
		}
		m.log.Info("unused image removed", "image", c.name, "diskUsedPercent", fmt.Sprintf("%.1f", used))
		m.mu.Lock()
		delete(m.imageUsed, c.name)
		m.mu.Unlock()
		removed = append(removed, c.name)
		if used, err = diskUsedPercent(m.cfg.DataDir); err != nil {
			return removed, err
		}
	}
	if used >= gc.LowPercent && !all {
		m.log.Warn("image garbage collection could not free enough space: every image left is in use or pinned",
			"diskUsedPercent", fmt.Sprintf("%.1f", used), "lowThresholdPercent", gc.LowPercent)
	}
	return removed, nil
}

// diskUsedPercent is how full the filesystem holding dir is, as the
// kubelet counts it: capacity less what is available to unprivileged
// users.
func diskUsedPercent(dir string) (float64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("image filesystem: %w", err)
	}
	if st.Blocks == 0 {
		return 0, nil
	}
	return 100 * float64(st.Blocks-st.Bavail) / float64(st.Blocks), nil
}
