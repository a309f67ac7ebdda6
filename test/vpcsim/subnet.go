package vpcsim

import (
	"math/rand/v2"
	"net/netip"
)

// prefixLen is the length of the IPv4 prefixes EC2 delegates to ENIs.
const prefixLen = 28

// prefixSize is the number of addresses in one delegated prefix.
const prefixSize = 1 << (32 - prefixLen)

// subnet tracks which of its addresses are held. EC2 reserves the first four
// addresses (network, VPC router, DNS, future use) and the last (broadcast)
// of every subnet; they are marked held from the start and never handed out.
type subnet struct {
	id, az string
	cidr   netip.Prefix
	tags   map[string]string
	used   []bool // by offset from the network address
	free   int
	// scatter, when set, picks takeAddrs' addresses at random
	// (Config.ScatterAddresses).
	scatter *rand.Rand
	// v6 is the subnet's IPv6 side; nil when it has no IPv6 CIDR block.
	v6 *subnet6
}

func newSubnet(id string, cidr netip.Prefix, az string, tags map[string]string) *subnet {
	n := 1 << (32 - cidr.Bits())
	s := &subnet{id: id, az: az, cidr: cidr, tags: copyTags(tags), used: make([]bool, n), free: n}
	for _, off := range []int{0, 1, 2, 3, n - 1} {
		s.used[off] = true
		s.free--
	}
	return s
}

// gateway is the subnet's VPC router address: network + 1.
func (s *subnet) gateway() netip.Addr { return s.addrAt(1) }

func (s *subnet) addrAt(off int) netip.Addr {
	b := s.cidr.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// offset returns a's offset in the subnet, or -1 when a is outside it.
func (s *subnet) offset(a netip.Addr) int {
	if !a.Is4() || !s.cidr.Contains(a) {
		return -1
	}
	x, n := a.As4(), s.cidr.Addr().As4()
	xv := uint32(x[0])<<24 | uint32(x[1])<<16 | uint32(x[2])<<8 | uint32(x[3])
	nv := uint32(n[0])<<24 | uint32(n[1])<<16 | uint32(n[2])<<8 | uint32(n[3])
	return int(xv - nv)
}

func (s *subnet) reserved(off int) bool {
	return off < 4 || off == len(s.used)-1
}

// takeAddrs holds n free addresses, lowest first (at random with scatter),
// and returns them; it holds none and returns nil when fewer than n are free.
func (s *subnet) takeAddrs(n int) []netip.Addr {
	if n > s.free {
		return nil
	}
	out := make([]netip.Addr, 0, n)
	if s.scatter != nil {
		var free []int
		for off, u := range s.used {
			if !u {
				free = append(free, off)
			}
		}
		for i := range n {
			j := i + s.scatter.IntN(len(free)-i)
			free[i], free[j] = free[j], free[i]
			s.setRange(free[i], 1, true)
			out = append(out, s.addrAt(free[i]))
		}
		return out
	}
	for off := range s.used {
		if len(out) == n {
			break
		}
		if !s.used[off] {
			s.used[off] = true
			s.free--
			out = append(out, s.addrAt(off))
		}
	}
	return out
}

// blockFree reports whether the aligned /28 at offset off is entirely free.
func (s *subnet) blockFree(off int) bool {
	if off+prefixSize > len(s.used) {
		return false
	}
	for i := off; i < off+prefixSize; i++ {
		if s.used[i] {
			return false
		}
	}
	return true
}

// freeBlocks counts the subnet's aligned /28s that are entirely free.
func (s *subnet) freeBlocks() int {
	n := 0
	for off := 0; off+prefixSize <= len(s.used); off += prefixSize {
		if s.blockFree(off) {
			n++
		}
	}
	return n
}

// takePrefixes holds n aligned, entirely free /28s, lowest first. It holds
// none and returns nil when fewer than n exist (fragmentation or a full subnet).
func (s *subnet) takePrefixes(n int) []netip.Prefix {
	var offs []int
	for off := 0; off+prefixSize <= len(s.used) && len(offs) < n; off += prefixSize {
		if s.blockFree(off) {
			offs = append(offs, off)
		}
	}
	if len(offs) < n {
		return nil
	}
	out := make([]netip.Prefix, 0, n)
	for _, off := range offs {
		s.setRange(off, prefixSize, true)
		out = append(out, netip.PrefixFrom(s.addrAt(off), prefixLen))
	}
	return out
}

func (s *subnet) setRange(off, n int, used bool) {
	for i := off; i < off+n; i++ {
		if s.used[i] != used {
			s.used[i] = used
			if used {
				s.free--
			} else {
				s.free++
			}
		}
	}
}

func (s *subnet) hold(a netip.Addr) { s.setRange(s.offset(a), 1, true) }

func (s *subnet) release(a netip.Addr) {
	if off := s.offset(a); off >= 0 && !s.reserved(off) {
		s.setRange(off, 1, false)
	}
}

func (s *subnet) holdPrefix(p netip.Prefix) { s.setRange(s.offset(p.Addr()), prefixSize, true) }

func (s *subnet) releasePrefix(p netip.Prefix) {
	if off := s.offset(p.Addr()); off >= 0 {
		s.setRange(off, prefixSize, false)
	}
}

func copyTags(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
