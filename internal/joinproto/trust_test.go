package joinproto_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"testing"

	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/joinproto"
)

// TestTrustedBundle: a node that trusts the old CA (by its token's hash,
// or because it holds it) takes the rotated bundle, whose new CA the old
// one endorsed; a CA nobody trusted endorsed is left out, and a bundle
// without the pinned CA is refused.
func TestTrustedBundle(t *testing.T) {
	dir := t.TempDir()
	old, err := pki.LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := pki.RotateCA(dir, filepath.Join(dir, "backup"))
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := pki.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hash := func(pem []byte) string { sum := sha256.Sum256(pem); return hex.EncodeToString(sum[:]) }
	holds := func(bundle []byte) func([]byte) bool {
		return func(block []byte) bool { return bytes.Contains(bundle, block) }
	}
	evil := append(append([]byte{}, stranger.CertPEM...), rotated.Bundle()...)
	tests := []struct {
		name    string
		bundle  []byte
		anchor  func([]byte) bool
		want    []byte // nil: an error
		without []byte
	}{
		{name: "token pins the old CA", bundle: rotated.Bundle(), anchor: joinproto.PinnedBy(old.Hash()), want: rotated.Bundle()},
		{name: "node holds the old CA", bundle: rotated.Bundle(), anchor: holds(old.CertPEM), want: rotated.Bundle()},
		{name: "token pins the new CA", bundle: rotated.Bundle(), anchor: joinproto.PinnedBy(rotated.Hash()), want: rotated.CertPEM},
		{name: "a stranger CA in the bundle", bundle: evil, anchor: joinproto.PinnedBy(old.Hash()), want: rotated.Bundle(), without: stranger.CertPEM},
		{name: "no pin: all", bundle: evil, anchor: joinproto.PinnedBy(""), want: evil},
		{name: "pinned CA absent", bundle: stranger.CertPEM, anchor: joinproto.PinnedBy(old.Hash())},
		{name: "not PEM", bundle: []byte("hello"), anchor: joinproto.PinnedBy("")},
		{name: "hash of the whole old bundle", bundle: old.CertPEM, anchor: joinproto.PinnedBy(hash(old.CertPEM)), want: old.CertPEM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := joinproto.TrustedBundle(tt.bundle, tt.anchor)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("trusted %d bytes, want an error", len(got))
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Errorf("got %d bytes (%v), want %d", len(got), err, len(tt.want))
			}
			if tt.without != nil && bytes.Contains(got, tt.without) {
				t.Error("the stranger CA is trusted")
			}
		})
	}
}
