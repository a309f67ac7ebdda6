package pool

import (
	"net/netip"
	"slices"
)

// The /28-aware choice of single addresses. EC2 delegates a /28 prefix only
// from an aligned /28 of the subnet that no one holds any address of; when
// none is left it refuses with InsufficientCidrBlocks, however many single
// addresses are free (EC2 AssignPrivateIpAddresses, "Assign prefixes to
// network interfaces"). Single secondary addresses scattered over the
// subnet are what breaks those blocks. The two functions below choose which
// single addresses a node gives back and which it asks for, so that the
// subnet keeps as many whole /28s as it can. They are pure: the caller
// passes what the node holds and, when it has one, a view of what every
// other ENI of the subnet holds (EC2 DescribeNetworkInterfaces filtered by
// subnet-id, see provider.Provider.SubnetUsage).

// blockOf is the aligned /28 holding a.
func blockOf(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 28).Masked() }

// reservedIn reports whether a is one of the five addresses EC2 reserves in
// subnet (network, VPC router, DNS, future use, broadcast). An invalid
// subnet reserves nothing.
func reservedIn(subnet netip.Prefix, a netip.Addr) bool {
	if !subnet.IsValid() || !subnet.Contains(a) {
		return false
	}
	base := subnet.Masked().Addr()
	for range 4 {
		if a == base {
			return true
		}
		base = base.Next()
	}
	return a == lastOf(subnet)
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// blockHasReserved reports whether the /28 b holds an address EC2 reserves
// in subnet, so that it can never be whole.
func blockHasReserved(subnet netip.Prefix, b netip.Prefix) bool {
	if !subnet.IsValid() {
		return false
	}
	return b.Contains(subnet.Masked().Addr()) || b.Contains(lastOf(subnet))
}

// PickRelease chooses n of the node's idle single addresses (free: /32
// secondary addresses no pod holds, none cooling) to give back, so that the
// subnet regains whole aligned /28s. held is every address the node holds
// in the subnet (primaries, secondaries in use or idle, the addresses of
// its /28 prefixes); others, when known (nil: unknown), is every address
// other ENIs of the subnet hold. subnet is the subnet's CIDR, for EC2's
// reserved addresses (invalid: unknown).
//
// Order of preference, by aligned /28 block:
//  1. blocks that become whole once the node's free addresses in them go
//     (the node keeps nothing there, others hold nothing, no reserved
//     address; known only with others), fewest addresses first;
//  2. blocks the node leaves entirely (it keeps nothing there), fewest
//     first, so that the node's remaining addresses stay packed in as few
//     /28s as possible;
//  3. the rest, from the blocks where the node holds fewest addresses.
//
// Blocks of tiers 1 and 2 are taken whole while they fit in n; what remains
// of n is taken address by address in the same order. The result is a
// subset of free with min(n, distinct free) addresses, sorted; it never
// names an address outside free.
func PickRelease(free []netip.Addr, n int, held []netip.Addr, others map[netip.Addr]bool, subnet netip.Prefix) []netip.Addr {
	cands := slices.Clone(free)
	slices.SortFunc(cands, netip.Addr.Compare)
	cands = slices.Compact(cands)
	if n <= 0 {
		return nil
	}
	if n >= len(cands) {
		return cands
	}
	type blk struct {
		base         netip.Prefix
		cands        []netip.Addr
		held, others int
		tier         int
	}
	byBase := map[netip.Prefix]*blk{}
	var blocks []*blk
	for _, a := range cands {
		b := blockOf(a)
		if byBase[b] == nil {
			byBase[b] = &blk{base: b}
			blocks = append(blocks, byBase[b])
		}
		byBase[b].cands = append(byBase[b].cands, a)
	}
	heldSet := make(map[netip.Addr]bool, len(held)+len(cands))
	for _, a := range held {
		heldSet[a] = true
	}
	for _, a := range cands {
		heldSet[a] = true // a free address is held, whatever the caller listed
	}
	for a := range heldSet {
		if b := byBase[blockOf(a)]; b != nil {
			b.held++
		}
	}
	for a := range others {
		if b := byBase[blockOf(a)]; b != nil && !heldSet[a] {
			b.others++
		}
	}
	for _, b := range blocks {
		keep := b.held - len(b.cands)
		switch {
		case keep == 0 && others != nil && b.others == 0 && !blockHasReserved(subnet, b.base):
			b.tier = 0
		case keep == 0:
			b.tier = 1
		default:
			b.tier = 2
		}
	}
	slices.SortStableFunc(blocks, func(x, y *blk) int {
		if x.tier != y.tier {
			return x.tier - y.tier
		}
		if x.tier < 2 {
			if d := len(x.cands) - len(y.cands); d != 0 {
				return d
			}
		} else if d := x.held - y.held; d != 0 {
			return d
		}
		return x.base.Addr().Compare(y.base.Addr())
	})
	out := make([]netip.Addr, 0, n)
	taken := map[netip.Prefix]bool{}
	for _, b := range blocks {
		if b.tier < 2 && len(b.cands) <= n-len(out) {
			out = append(out, b.cands...)
			taken[b.base] = true
		}
	}
	for _, b := range blocks {
		if taken[b.base] {
			continue
		}
		for _, a := range b.cands {
			if len(out) == n {
				break
			}
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// PickAssign chooses n free addresses of subnet inside aligned /28s that are
// already broken (some address of the block is held, by the node, by
// others or by EC2's reservation), so that a single-address assignment
// (EC2 AssignPrivateIpAddresses with PrivateIpAddresses) breaks no whole
// /28. held is every address the node holds in the subnet, others every
// address the other ENIs hold (a view, possibly stale). Blocks the node
// already holds addresses in come first (it refills the holes its own
// releases left, which other nodes are least likely to name at the same
// time), then the others; within each, fullest first (least likely to
// become whole again), ties in an order given by salt, and inside a block
// from an offset given by salt (callers pass a value of their own, such as
// a hash of the ENI id, so that nodes reading the same view do not all name
// the same addresses; 0: address order). It
// returns nil when
// others is nil (no view), subnet is invalid or fewer than n such addresses
// are free: the caller then lets EC2 choose.
func PickAssign(n int, held []netip.Addr, others map[netip.Addr]bool, subnet netip.Prefix, salt uint64) []netip.Addr {
	if n <= 0 || others == nil || !subnet.IsValid() || !subnet.Addr().Is4() || subnet.Bits() > 28 {
		return nil
	}
	subnet = subnet.Masked()
	taken := make(map[netip.Addr]bool, len(held)+len(others))
	own := map[netip.Prefix]bool{}
	for _, a := range held {
		if subnet.Contains(a) {
			taken[a] = true
			own[blockOf(a)] = true
		}
	}
	for a := range others {
		if subnet.Contains(a) {
			taken[a] = true
		}
	}
	for a := subnet.Addr(); reservedIn(subnet, a); a = a.Next() {
		taken[a] = true
	}
	taken[lastOf(subnet)] = true
	used := map[netip.Prefix]int{}
	for a := range taken {
		used[blockOf(a)]++
	}
	type blk struct {
		base netip.Prefix
		used int
	}
	var broken []blk
	for b, u := range used {
		broken = append(broken, blk{b, u})
	}
	mix := func(b netip.Prefix) uint64 {
		if salt == 0 {
			return 0
		}
		v := b.Addr().As4()
		h := salt ^ (uint64(v[0])<<24 | uint64(v[1])<<16 | uint64(v[2])<<8 | uint64(v[3]))
		h ^= h >> 33
		h *= 0xff51afd7ed558ccd
		h ^= h >> 33
		return h
	}
	slices.SortFunc(broken, func(x, y blk) int {
		if own[x.base] != own[y.base] {
			if own[x.base] {
				return -1
			}
			return 1
		}
		if x.used != y.used {
			return y.used - x.used
		}
		if hx, hy := mix(x.base), mix(y.base); hx != hy {
			if hx < hy {
				return -1
			}
			return 1
		}
		return x.base.Addr().Compare(y.base.Addr())
	})
	var out []netip.Addr
	for _, b := range broken {
		// Within the block, start at a salted offset too: nodes filling
		// the same block do not all name its lowest hole.
		start := b.base.Addr()
		for range mix(b.base) % 16 {
			start = start.Next()
		}
		a := start
		for range 16 {
			if len(out) == n {
				break
			}
			if !taken[a] {
				out = append(out, a)
			}
			if a = a.Next(); !b.base.Contains(a) {
				a = b.base.Addr()
			}
		}
		if len(out) == n {
			slices.SortFunc(out, netip.Addr.Compare)
			return out
		}
	}
	return nil
}
