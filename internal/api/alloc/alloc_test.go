package alloc

import (
	"errors"
	"net/netip"
	"testing"
)

func TestIPs(t *testing.T) {
	a, err := NewIPs("10.43.0.0/29") // 8 addresses: .1 to .6 usable
	if err != nil {
		t.Fatal(err)
	}
	if a.First() != netip.MustParseAddr("10.43.0.1") {
		t.Errorf("first = %s", a.First())
	}
	steps := []struct {
		name string
		do   func() error
		want error
	}{
		{"claim .1", func() error { return a.Allocate(netip.MustParseAddr("10.43.0.1")) }, nil},
		{"claim .1 again", func() error { return a.Allocate(netip.MustParseAddr("10.43.0.1")) }, ErrAllocated},
		{"network address", func() error { return a.Allocate(netip.MustParseAddr("10.43.0.0")) }, ErrNotInRange},
		{"broadcast address", func() error { return a.Allocate(netip.MustParseAddr("10.43.0.7")) }, ErrNotInRange},
		{"outside", func() error { return a.Allocate(netip.MustParseAddr("10.44.0.1")) }, ErrNotInRange},
	}
	for _, s := range steps {
		if err := s.do(); !errors.Is(err, s.want) {
			t.Errorf("%s: %v, want %v", s.name, err, s.want)
		}
	}
	seen := map[netip.Addr]bool{}
	for range 5 {
		ip, err := a.Next()
		if err != nil {
			t.Fatal(err)
		}
		if seen[ip] || ip == netip.MustParseAddr("10.43.0.1") {
			t.Fatalf("handed out %s twice", ip)
		}
		seen[ip] = true
	}
	if _, err := a.Next(); !errors.Is(err, ErrFull) {
		t.Fatalf("exhausted range: %v", err)
	}
	a.Release(netip.MustParseAddr("10.43.0.4"))
	if ip, err := a.Next(); err != nil || ip != netip.MustParseAddr("10.43.0.4") {
		t.Fatalf("after release: %s %v", ip, err)
	}
	a.Release(netip.MustParseAddr("192.168.0.1")) // not ours: harmless
}

func TestIPsRejectsBadCIDRs(t *testing.T) {
	for _, cidr := range []string{"", "10.43.0.0", "10.43.0.0/31", "nonsense/16"} {
		if _, err := NewIPs(cidr); err == nil {
			t.Errorf("NewIPs(%q) accepted", cidr)
		}
	}
	if _, err := NewIPs("fd00:43::/112"); err != nil {
		t.Errorf("IPv6 service range: %v", err)
	}
}

func TestPorts(t *testing.T) {
	p := NewPorts(30000, 30002)
	if err := p.Allocate(30001); err != nil {
		t.Fatal(err)
	}
	if err := p.Allocate(30001); !errors.Is(err, ErrPortInUse) {
		t.Errorf("double allocation: %v", err)
	}
	if err := p.Allocate(29999); !errors.Is(err, ErrNotInRange) {
		t.Errorf("below range: %v", err)
	}
	got := map[int]bool{}
	for range 2 {
		port, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		got[port] = true
	}
	if !got[30000] || !got[30002] {
		t.Errorf("next handed out %v", got)
	}
	if _, err := p.Next(); !errors.Is(err, ErrFull) {
		t.Errorf("full range: %v", err)
	}
	p.Release(30001)
	if port, err := p.Next(); err != nil || port != 30001 {
		t.Errorf("after release: %d %v", port, err)
	}
}
