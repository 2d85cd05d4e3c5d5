// Package alloc hands out Service cluster IPs from the service CIDR and
// NodePorts from 30000-32767. The server rebuilds both from the stored
// Services at start, so nothing is handed out twice across a restart.
package alloc

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"sync"
)

// Errors an allocator returns.
var (
	ErrAllocated  = errors.New("provided IP is already allocated")
	ErrPortInUse  = errors.New("provided port is already allocated")
	ErrNotInRange = errors.New("not in the valid range")
	ErrFull       = errors.New("range is full")
)

// bitmap tracks which of size offsets are taken, handing out the next free
// one after the last given, so a released value is not reused at once.
type bitmap struct {
	mu   sync.Mutex
	used big.Int
	size int
	next int
	// reserved offsets are never handed out by Next (network address,
	// broadcast), though Take may not claim them either.
	reserved map[int]bool
}

func (b *bitmap) take(i int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used.Bit(i) == 1 {
		return false
	}
	b.used.SetBit(&b.used, i, 1)
	return true
}

func (b *bitmap) takeNext() (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n := 0; n < b.size; n++ {
		i := (b.next + n) % b.size
		if b.used.Bit(i) == 0 && !b.reserved[i] {
			b.used.SetBit(&b.used, i, 1)
			b.next = (i + 1) % b.size
			return i, true
		}
	}
	return 0, false
}

func (b *bitmap) release(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used.SetBit(&b.used, i, 0)
}

// IPs allocates addresses of one IPv4 or IPv6 prefix.
type IPs struct {
	prefix netip.Prefix
	bits   bitmap
}

// maxIPs caps the tracked range of a large (IPv6) prefix.
const maxIPs = 1 << 16

// NewIPs allocates within cidr, never its network or broadcast address.
func NewIPs(cidr string) (*IPs, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	p = p.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	if hostBits < 2 {
		return nil, fmt.Errorf("service CIDR %q is too small", cidr)
	}
	size := maxIPs
	if hostBits < 16 {
		size = 1 << hostBits
	}
	a := &IPs{prefix: p, bits: bitmap{size: size, next: 1, reserved: map[int]bool{0: true}}}
	if p.Addr().Is4() {
		a.bits.reserved[size-1] = true
	}
	return a, nil
}

// First is the first usable address: the kubernetes Service's.
func (a *IPs) First() netip.Addr { return a.prefix.Addr().Next() }

func (a *IPs) offset(ip netip.Addr) (int, bool) {
	if !a.prefix.Contains(ip) {
		return 0, false
	}
	base := a.prefix.Addr().As16()
	x := ip.As16()
	off := 0
	for i := 0; i < 16; i++ {
		d := int(x[i]) - int(base[i])
		if off > maxIPs {
			return 0, false
		}
		off = off*256 + d
	}
	if off <= 0 || off >= a.bits.size || a.bits.reserved[off] {
		return 0, false
	}
	return off, true
}

// Allocate claims ip.
func (a *IPs) Allocate(ip netip.Addr) error {
	off, ok := a.offset(ip)
	if !ok {
		return fmt.Errorf("%s: %w %s", ip, ErrNotInRange, a.prefix)
	}
	if !a.bits.take(off) {
		return fmt.Errorf("%s: %w", ip, ErrAllocated)
	}
	return nil
}

// Next claims the next free address.
func (a *IPs) Next() (netip.Addr, error) {
	off, ok := a.bits.takeNext()
	if !ok {
		return netip.Addr{}, fmt.Errorf("no IP addresses available in %s: %w", a.prefix, ErrFull)
	}
	ip := a.prefix.Addr()
	for i := 0; i < off; i++ {
		ip = ip.Next()
	}
	return ip, nil
}

// Release frees ip; releasing an address not held is harmless.
func (a *IPs) Release(ip netip.Addr) {
	if off, ok := a.offset(ip); ok {
		a.bits.release(off)
	}
}

// Ports allocates from an inclusive port range.
type Ports struct {
	first, last int
	bits        bitmap
}

// NewPorts allocates within [first, last].
func NewPorts(first, last int) *Ports {
	return &Ports{first: first, last: last, bits: bitmap{size: last - first + 1}}
}

// Range is the range as Kubernetes prints it in errors.
func (p *Ports) Range() string { return fmt.Sprintf("%d-%d", p.first, p.last) }

// Allocate claims port.
func (p *Ports) Allocate(port int) error {
	if port < p.first || port > p.last {
		return fmt.Errorf("%d: %w %s", port, ErrNotInRange, p.Range())
	}
	if !p.bits.take(port - p.first) {
		return fmt.Errorf("%d: %w", port, ErrPortInUse)
	}
	return nil
}

// Next claims the next free port.
func (p *Ports) Next() (int, error) {
	off, ok := p.bits.takeNext()
	if !ok {
		return 0, fmt.Errorf("no node ports available in %s: %w", p.Range(), ErrFull)
	}
	return p.first + off, nil
}

// Release frees port.
func (p *Ports) Release(port int) {
	if port >= p.first && port <= p.last {
		p.bits.release(port - p.first)
	}
}
