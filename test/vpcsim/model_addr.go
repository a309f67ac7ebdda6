package vpcsim

import (
	"net/netip"
	"slices"
)

// holds records addresses and prefixes taken from a subnet during one call,
// so that a failing call gives them all back.
type holds struct {
	s        *subnet
	addrs    []netip.Addr
	prefixes []netip.Prefix
}

func (h *holds) undo() {
	for _, a := range h.addrs {
		h.s.release(a)
	}
	for _, p := range h.prefixes {
		h.s.releasePrefix(p)
	}
	h.addrs, h.prefixes = nil, nil
}

func errSubnetFull(subnetID string) *Error {
	return errorf("InsufficientFreeAddressesInSubnet", "The specified subnet %s does not have enough free addresses to satisfy the request.", subnetID)
}

// holdExplicitLocked checks and holds explicitly requested addresses for e.
// With reassign, an address that is a secondary IP of another ENI in the
// subnet is taken from it (EC2 AllowReassignment).
func (c *Cloud) holdExplicitLocked(h *holds, e *eni, addrs []netip.Addr, reassign bool) *Error {
	seen := map[netip.Addr]bool{}
	var moves []netip.Addr
	for _, a := range addrs {
		off := h.s.offset(a)
		switch {
		case off < 0:
			return errorf("InvalidParameterValue", "Address %s does not fall within the subnet's address range", a)
		case h.s.reserved(off):
			return errorf("InvalidParameterValue", "Address %s is in subnet's reserved address range", a)
		case seen[a]:
			return errorf("InvalidParameterValue", "Address %s is specified more than once", a)
		}
		seen[a] = true
		if h.s.used[off] {
			owner, secondary := c.holderLocked(a)
			if owner == e {
				return errorf("InvalidParameterValue", "Address %s is already assigned to %s", a, e.id)
			}
			if !reassign || !secondary {
				return errorf("InvalidParameterValue", "Address %s is in use", a)
			}
			moves = append(moves, a)
		}
	}
	for _, a := range moves {
		owner, _ := c.holderLocked(a)
		owner.secondaries = slices.DeleteFunc(owner.secondaries, func(x netip.Addr) bool { return x == a })
		h.s.release(a)
		c.recordIMDSLocked(owner.inst)
		if c.observer != nil {
			c.observer.AddressesUnassigned(owner.id, []netip.Prefix{netip.PrefixFrom(a, 32)})
		}
	}
	for _, a := range addrs {
		h.s.hold(a)
		h.addrs = append(h.addrs, a)
	}
	return nil
}

// holderLocked returns the ENI holding a, and whether a is one of its
// secondary IPs (rather than its primary or inside one of its prefixes).
func (c *Cloud) holderLocked(a netip.Addr) (*eni, bool) {
	for _, e := range c.enis {
		if e.primary == a {
			return e, false
		}
		if slices.Contains(e.secondaries, a) {
			return e, true
		}
		for _, p := range e.prefixes {
			if p.Contains(a) {
				return e, false
			}
		}
	}
	return nil, false
}

// holdNewLocked holds count more addresses, the explicit prefixes and
// prefixCount more aligned /28s, appending them to h.
func (c *Cloud) holdNewLocked(h *holds, count int, prefixes []netip.Prefix, prefixCount int) *Error {
	if count > 0 {
		got := h.s.takeAddrs(count)
		if got == nil {
			return errSubnetFull(h.s.id)
		}
		h.addrs = append(h.addrs, got...)
	}
	for i, p := range prefixes {
		off := h.s.offset(p.Addr())
		if p.Bits() != prefixLen || p.Masked() != p || off < 0 || !h.s.blockFree(off) || slices.Contains(prefixes[:i], p) {
			return errorf("InvalidParameterValue", "The prefix %s is not a free /28 in subnet %s", p, h.s.id)
		}
		h.s.holdPrefix(p)
		h.prefixes = append(h.prefixes, p)
	}
	if prefixCount > 0 {
		got := h.s.takePrefixes(prefixCount)
		if got == nil {
			return errorf("InsufficientCidrBlocks", "The specified subnet %s does not have enough free cidr blocks to satisfy the request.", h.s.id)
		}
		h.prefixes = append(h.prefixes, got...)
	}
	return nil
}

// assignRequest is AssignPrivateIpAddresses' input, parsed.
type assignRequest struct {
	eniID       string
	count       int
	addrs       []netip.Addr
	prefixCount int
	prefixes    []netip.Prefix
	reassign    bool
}

// assignLocked assigns secondary IPs or /28 prefixes to an ENI
// (EC2 AssignPrivateIpAddresses). It returns what was assigned; nothing
// changes when it fails.
func (c *Cloud) assignLocked(req assignRequest) ([]netip.Addr, []netip.Prefix, *Error) {
	e, ok := c.enis[req.eniID]
	if !ok {
		return nil, nil, errENINotFound(req.eniID)
	}
	addrKind := req.count > 0 || len(req.addrs) > 0
	prefixKind := req.prefixCount > 0 || len(req.prefixes) > 0
	switch {
	case !addrKind && !prefixKind:
		return nil, nil, errorf("MissingParameter", "Either SecondaryPrivateIpAddressCount, PrivateIpAddress, Ipv4PrefixCount or Ipv4Prefix must be specified.")
	case (req.count > 0 && len(req.addrs) > 0) || (req.prefixCount > 0 && len(req.prefixes) > 0) || (addrKind && prefixKind):
		return nil, nil, errorf("InvalidParameterCombination", "Specify only one of SecondaryPrivateIpAddressCount, PrivateIpAddress, Ipv4PrefixCount and Ipv4Prefix.")
	case prefixKind && !e.prefixesAllowed():
		return nil, nil, errorf("InvalidParameterValue", "Prefix delegation is not supported for instance type %s.", e.inst.typ)
	}
	n := req.count + len(req.addrs) + req.prefixCount + len(req.prefixes)
	if e.slots()+n > e.addressLimit() {
		return nil, nil, errorf("PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit.")
	}
	h := holds{s: c.subnets[e.subnetID]}
	if err := c.holdExplicitLocked(&h, e, req.addrs, req.reassign); err != nil {
		return nil, nil, err
	}
	if err := c.holdNewLocked(&h, req.count, req.prefixes, req.prefixCount); err != nil {
		h.undo()
		return nil, nil, err
	}
	e.secondaries = append(e.secondaries, h.addrs...)
	e.prefixes = append(e.prefixes, h.prefixes...)
	c.recordIMDSLocked(e.inst)
	if c.observer != nil {
		c.observer.AddressesAssigned(e.id, asPrefixes(h.addrs, h.prefixes))
	}
	return h.addrs, h.prefixes, nil
}

// unassignLocked takes secondary IPs or prefixes off an ENI and frees them
// (EC2 UnassignPrivateIpAddresses). Every one must be held by the ENI;
// nothing changes when one is not.
func (c *Cloud) unassignLocked(eniID string, addrs []netip.Addr, prefixes []netip.Prefix) *Error {
	e, ok := c.enis[eniID]
	if !ok {
		return errENINotFound(eniID)
	}
	switch {
	case len(addrs) == 0 && len(prefixes) == 0:
		return errorf("MissingParameter", "Either PrivateIpAddress or Ipv4Prefix must be specified.")
	case len(addrs) > 0 && len(prefixes) > 0:
		return errorf("InvalidParameterCombination", "Specify either PrivateIpAddress or Ipv4Prefix, not both.")
	}
	for _, a := range addrs {
		if a == e.primary {
			return errorf("InvalidParameterValue", "The primary private address %s of %s cannot be unassigned.", a, e.id)
		}
		if !slices.Contains(e.secondaries, a) {
			return errorf("InvalidParameterValue", "Some of the specified addresses are not assigned to interface %s", e.id)
		}
	}
	for _, p := range prefixes {
		if !slices.Contains(e.prefixes, p) {
			return errorf("InvalidParameterValue", "Some of the specified prefixes are not assigned to interface %s", e.id)
		}
	}
	s := c.subnets[e.subnetID]
	for _, a := range addrs {
		s.release(a)
	}
	for _, p := range prefixes {
		s.releasePrefix(p)
	}
	e.secondaries = slices.DeleteFunc(e.secondaries, func(a netip.Addr) bool { return slices.Contains(addrs, a) })
	e.prefixes = slices.DeleteFunc(e.prefixes, func(p netip.Prefix) bool { return slices.Contains(prefixes, p) })
	c.recordIMDSLocked(e.inst)
	if c.observer != nil {
		c.observer.AddressesUnassigned(e.id, asPrefixes(slices.Compact(slices.Clone(addrs)), slices.Compact(slices.Clone(prefixes))))
	}
	return nil
}

func asPrefixes(addrs []netip.Addr, prefixes []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(addrs)+len(prefixes))
	for _, a := range addrs {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return append(out, prefixes...)
}
