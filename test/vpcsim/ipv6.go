package vpcsim

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
)

// IPv6 in the model follows EC2: the VPC has one /56 ("Amazon-provided IPv6
// CIDR block"), each subnet a /64 of it (or none), and an ENI in a subnet
// with a /64 holds IPv6 addresses and /80 prefixes from it
// (AssignIpv6Addresses). EC2 reserves the first four and the last address
// of every subnet's IPv6 CIDR block, as for IPv4. IPv6 addresses are
// chosen at random in the /64, as EC2's are; /80 prefixes are aligned.
// IMDS lists them (ipv6s, ipv6-prefix, subnet-ipv6-cidr-blocks,
// vpc-ipv6-cidr-blocks, ipv6). The Observer is told of IPv6 assignments
// as of IPv4 ones (AddressesAssigned/Unassigned with /128s and /80s), so
// the fabric routes them. An ENI's first IPv6 address in assignment order
// is its primary IPv6 address: IMDS's meta-data/ipv6 for the primary ENI,
// the address InstanceByAddress knows an instance by over IPv6.

const (
	vpcIPv6Bits    = 56 // EC2's Amazon-provided VPC IPv6 CIDR block
	subnetIPv6Bits = 64 // EC2's subnet IPv6 CIDR block
	// ipv6PrefixLen is the length of the IPv6 prefixes EC2 delegates to
	// ENIs (Ipv6PrefixCount): /80.
	ipv6PrefixLen = 80
)

// amazonIPv6Pool is where the default VPC /56 comes from: a range of
// Amazon's own IPv6 space (2600:1f00::/24 is Amazon's EC2 pool).
var amazonIPv6Pool = netip.MustParsePrefix("2600:1f14::/32")

// subnet6 is the IPv6 side of a subnet: its /64 and what of it is held.
type subnet6 struct {
	cidr     netip.Prefix
	addrs    map[netip.Addr]bool   // held IPv6 addresses
	prefixes map[netip.Prefix]bool // held /80s
	rnd      *rand.Rand
	// autoAssign gives every new ENI one address
	// (SubnetSpec.AssignIPv6OnCreation).
	autoAssign bool
}

// setVPCIPv6 gives the VPC its /56 (Config.VPCIPv6CIDR, or one of
// amazonIPv6Pool chosen by Seed) unless Config.NoIPv6.
func (c *Cloud) setVPCIPv6(cfg Config) error {
	if cfg.NoIPv6 {
		if cfg.VPCIPv6CIDR.IsValid() {
			return fmt.Errorf("vpcsim: NoIPv6 with VPCIPv6CIDR %s", cfg.VPCIPv6CIDR)
		}
		return nil
	}
	p := cfg.VPCIPv6CIDR
	if !p.IsValid() {
		r := c.ipv6Rand(0)
		b := amazonIPv6Pool.Addr().As16()
		v := r.Uint32()
		b[4], b[5], b[6] = byte(v>>16), byte(v>>8), byte(v)
		p = netip.PrefixFrom(netip.AddrFrom16(b), vpcIPv6Bits)
	}
	if !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() != vpcIPv6Bits || p.Masked() != p {
		return fmt.Errorf("vpcsim: VPC IPv6 CIDR %s: want an IPv6 /56", p)
	}
	c.vpc.ipv6 = p
	return nil
}

// ipv6Rand is a source for IPv6 choices: from Seed (stream n) when set,
// random otherwise. It is apart from the id source so that ids stay as
// they were before IPv6.
func (c *Cloud) ipv6Rand(n uint64) *rand.Rand {
	if c.cfg.Seed != 0 {
		return rand.New(rand.NewPCG(uint64(c.cfg.Seed), 0x6970763600+n))
	}
	return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}

// setSubnetIPv6 gives a new subnet its /64 (spec.IPv6CIDR, or the lowest
// /64 of the VPC's /56 that no subnet has) unless the VPC has no IPv6 or
// spec.NoIPv6.
func (c *Cloud) setSubnetIPv6(s *subnet, spec SubnetSpec) error {
	if spec.NoIPv6 || !c.vpc.ipv6.IsValid() {
		if spec.IPv6CIDR.IsValid() || spec.AssignIPv6OnCreation {
			return fmt.Errorf("vpcsim: subnet %s: IPv6 CIDR %s or AssignIPv6OnCreation without IPv6", s.cidr, spec.IPv6CIDR)
		}
		return nil
	}
	taken := func(p netip.Prefix) bool {
		for _, id := range c.subnetIDs {
			if o := c.subnets[id].v6; o != nil && o.cidr == p {
				return true
			}
		}
		return false
	}
	p := spec.IPv6CIDR
	if p.IsValid() {
		if p.Bits() != subnetIPv6Bits || p.Masked() != p || !c.vpc.ipv6.Contains(p.Addr()) {
			return fmt.Errorf("vpcsim: subnet IPv6 CIDR %s: want a /64 of the VPC's %s", p, c.vpc.ipv6)
		}
		if taken(p) {
			return fmt.Errorf("vpcsim: subnet IPv6 CIDR %s is taken", p)
		}
	} else {
		b := c.vpc.ipv6.Addr().As16()
		for i := range 1 << (subnetIPv6Bits - vpcIPv6Bits) {
			b[7] = byte(i)
			if q := netip.PrefixFrom(netip.AddrFrom16(b), subnetIPv6Bits); !taken(q) {
				p = q
				break
			}
		}
		if !p.IsValid() {
			return fmt.Errorf("vpcsim: no free /64 left in the VPC's %s", c.vpc.ipv6)
		}
	}
	s.v6 = &subnet6{cidr: p, addrs: map[netip.Addr]bool{}, prefixes: map[netip.Prefix]bool{}, rnd: c.ipv6Rand(uint64(1 + len(c.subnetIDs))), autoAssign: spec.AssignIPv6OnCreation}
	return nil
}

func (s *subnet) ipv6CIDR() netip.Prefix {
	if s.v6 == nil {
		return netip.Prefix{}
	}
	return s.v6.cidr
}

// hostPart returns the low 64 bits of a.
func hostPart(a netip.Addr) uint64 {
	b := a.As16()
	var v uint64
	for _, x := range b[8:] {
		v = v<<8 | uint64(x)
	}
	return v
}

func (s *subnet6) withHost(h uint64) netip.Addr {
	b := s.cidr.Addr().As16()
	for i := 15; i >= 8; i-- {
		b[i] = byte(h)
		h >>= 8
	}
	return netip.AddrFrom16(b)
}

// reserved reports whether a is one of the addresses EC2 keeps in every
// subnet IPv6 CIDR block: the first four and the last.
func (s *subnet6) reserved(a netip.Addr) bool {
	h := hostPart(a)
	return h < 4 || h == ^uint64(0)
}

// addrFree reports whether a, inside the /64, may be handed out: not
// reserved, not held, not inside a held /80.
func (s *subnet6) addrFree(a netip.Addr) bool {
	return !s.reserved(a) && !s.addrs[a] && !s.prefixes[netip.PrefixFrom(a, ipv6PrefixLen).Masked()]
}

// prefixFree reports whether the /80 p may be handed out: not held, no
// held or reserved address inside.
func (s *subnet6) prefixFree(p netip.Prefix) bool {
	if s.prefixes[p] || s.reserved(p.Addr()) || s.reserved(lastAddr(p)) {
		return false
	}
	for a := range s.addrs {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom16(b)
}

// takeAddrs holds n free addresses chosen at random in the /64.
func (s *subnet6) takeAddrs(n int) []netip.Addr {
	out := make([]netip.Addr, 0, n)
	for len(out) < n {
		a := s.withHost(s.rnd.Uint64())
		if s.addrFree(a) {
			s.addrs[a] = true
			out = append(out, a)
		}
	}
	return out
}

// takePrefixes holds n free /80s chosen at random in the /64, or none and
// returns nil when fewer than n are free.
func (s *subnet6) takePrefixes(n int) []netip.Prefix {
	const perSubnet = 1 << (ipv6PrefixLen - subnetIPv6Bits)
	var out []netip.Prefix
	start := s.rnd.IntN(perSubnet)
	for i := 0; i < perSubnet && len(out) < n; i++ {
		p := netip.PrefixFrom(s.withHost(uint64((start+i)%perSubnet)<<(128-ipv6PrefixLen)), ipv6PrefixLen)
		if s.prefixFree(p) {
			s.prefixes[p] = true
			out = append(out, p)
		}
	}
	if len(out) < n {
		s.releaseAll(nil, out)
		return nil
	}
	return out
}

// releaseAll frees addresses and /80s; s may be nil (no IPv6).
func (s *subnet6) releaseAll(addrs []netip.Addr, prefixes []netip.Prefix) {
	if s == nil {
		return
	}
	for _, a := range addrs {
		delete(s.addrs, a)
	}
	for _, p := range prefixes {
		delete(s.prefixes, p)
	}
}

// ipv6Limit is the per-ENI IPv6 limit: the instance type's "IPv6
// addresses per interface" when attached (each /80 prefix counts as one,
// as each /28 does for IPv4), the largest such figure of any type when not.
func (e *eni) ipv6Limit() int {
	if e.inst != nil {
		return e.inst.itype.IPv6PerENI
	}
	return maxIPv6PerENI
}

// checkIPv6OnAttach refuses to attach an ENI whose IPv6 addresses or
// prefixes the instance type cannot hold.
func checkIPv6OnAttach(e *eni, inst *instance) *Error {
	n := len(e.ipv6) + len(e.ipv6Prefixes)
	switch {
	case n > 0 && !inst.itype.IPv6Supported:
		return errorf("InvalidParameterValue", "Instance type %s does not support IPv6.", inst.typ)
	case n > inst.itype.IPv6PerENI:
		return errorf("InvalidParameterValue", "Number of IPv6 addresses on %s exceeds the limit of %s.", e.id, inst.typ)
	case len(e.ipv6Prefixes) > 0 && !inst.itype.PrefixDelegation():
		return errorf("InvalidParameterValue", "Prefix delegation is not supported for instance type %s.", inst.typ)
	}
	return nil
}

// assign6Request is AssignIpv6Addresses' input, parsed.
type assign6Request struct {
	eniID       string
	count       int
	addrs       []netip.Addr
	prefixCount int
	prefixes    []netip.Prefix
}

// assignIPv6Locked assigns IPv6 addresses or /80 prefixes to an ENI
// (EC2 AssignIpv6Addresses). It returns what was assigned; nothing changes
// when it fails. Errors (*Error, HTTP 400):
//   - InvalidNetworkInterfaceID.NotFound: no such ENI;
//   - MissingParameter: none of Ipv6AddressCount, Ipv6Addresses,
//     Ipv6PrefixCount, Ipv6Prefixes;
//   - InvalidParameterValue: more than one of them (EC2 takes one of
//     addresses or address count, prefixes or prefix count); the ENI's
//     subnet has no IPv6 CIDR block; the instance type has no IPv6;
//     prefixes on a type without prefix delegation (not Nitro, not bare
//     metal); the type's "IPv6 addresses per interface" exceeded (each /80
//     counts as one); a named address or prefix outside the subnet's /64,
//     reserved, not /80-aligned or in use;
//   - InsufficientCidrBlocks: fewer free /80s than Ipv6PrefixCount.
func (c *Cloud) assignIPv6Locked(req assign6Request) ([]netip.Addr, []netip.Prefix, *Error) {
	e, ok := c.enis[req.eniID]
	if !ok {
		return nil, nil, errENINotFound(req.eniID)
	}
	kinds := 0
	for _, set := range []bool{req.count > 0, len(req.addrs) > 0, req.prefixCount > 0, len(req.prefixes) > 0} {
		if set {
			kinds++
		}
	}
	s := c.subnets[e.subnetID]
	prefixKind := req.prefixCount > 0 || len(req.prefixes) > 0
	switch {
	case kinds == 0:
		return nil, nil, errorf("MissingParameter", "Either Ipv6AddressCount, Ipv6Addresses, Ipv6PrefixCount or Ipv6Prefixes must be specified.")
	case kinds > 1:
		return nil, nil, errorf("InvalidParameterValue", "Only one of Ipv6Addresses, Ipv6AddressCount, Ipv6Prefixes and Ipv6PrefixCount may be specified.")
	case s.v6 == nil:
		return nil, nil, errorf("InvalidParameterValue", "The subnet %s of network interface %s has no IPv6 CIDR block.", s.id, e.id)
	case e.inst != nil && !e.inst.itype.IPv6Supported:
		return nil, nil, errorf("InvalidParameterValue", "Instance type %s does not support IPv6.", e.inst.typ)
	case prefixKind && !e.prefixesAllowed():
		return nil, nil, errorf("InvalidParameterValue", "Prefix delegation is not supported for instance type %s.", e.inst.typ)
	}
	n := req.count + len(req.addrs) + req.prefixCount + len(req.prefixes)
	if len(e.ipv6)+len(e.ipv6Prefixes)+n > e.ipv6Limit() {
		return nil, nil, errorf("InvalidParameterValue", "Number of IPv6 addresses on %s would exceed the limit of %d per interface.", e.id, e.ipv6Limit())
	}
	v6 := s.v6
	var addrs []netip.Addr
	var prefixes []netip.Prefix
	for i, a := range req.addrs {
		switch {
		case !v6.cidr.Contains(a):
			return nil, nil, errorf("InvalidParameterValue", "Address %s does not fall within the subnet's IPv6 CIDR block %s", a, v6.cidr)
		case v6.reserved(a):
			return nil, nil, errorf("InvalidParameterValue", "Address %s is in subnet's reserved address range", a)
		case slices.Contains(req.addrs[:i], a):
			return nil, nil, errorf("InvalidParameterValue", "Address %s is specified more than once", a)
		case !v6.addrFree(a):
			return nil, nil, errorf("InvalidParameterValue", "Address %s is in use", a)
		}
	}
	for i, p := range req.prefixes {
		switch {
		case p.Bits() != ipv6PrefixLen || p.Masked() != p || !v6.cidr.Contains(p.Addr()):
			return nil, nil, errorf("InvalidParameterValue", "The prefix %s is not an aligned /80 of the subnet's IPv6 CIDR block %s", p, v6.cidr)
		case slices.Contains(req.prefixes[:i], p) || !v6.prefixFree(p):
			return nil, nil, errorf("InvalidParameterValue", "The prefix %s is in use", p)
		}
	}
	switch {
	case len(req.addrs) > 0:
		for _, a := range req.addrs {
			v6.addrs[a] = true
		}
		addrs = req.addrs
	case req.count > 0:
		addrs = v6.takeAddrs(req.count)
	case len(req.prefixes) > 0:
		for _, p := range req.prefixes {
			v6.prefixes[p] = true
		}
		prefixes = req.prefixes
	default:
		if prefixes = v6.takePrefixes(req.prefixCount); prefixes == nil {
			return nil, nil, errorf("InsufficientCidrBlocks", "The specified subnet %s does not have enough free cidr blocks to satisfy the request.", s.id)
		}
	}
	e.ipv6 = append(e.ipv6, addrs...)
	e.ipv6Prefixes = append(e.ipv6Prefixes, prefixes...)
	c.recordIMDSLocked(e.inst)
	if c.observer != nil {
		c.observer.AddressesAssigned(e.id, asPrefixes(addrs, prefixes))
	}
	return addrs, prefixes, nil
}

// unassignIPv6Locked takes IPv6 addresses and /80 prefixes off an ENI and
// frees them (EC2 UnassignIpv6Addresses). Every one must be held by the
// ENI; nothing changes when one is not. Errors (*Error, HTTP 400):
// InvalidNetworkInterfaceID.NotFound, MissingParameter (neither
// Ipv6Addresses nor Ipv6Prefix), InvalidParameterValue (one not assigned
// to the ENI).
func (c *Cloud) unassignIPv6Locked(eniID string, addrs []netip.Addr, prefixes []netip.Prefix) *Error {
	e, ok := c.enis[eniID]
	if !ok {
		return errENINotFound(eniID)
	}
	if len(addrs) == 0 && len(prefixes) == 0 {
		return errorf("MissingParameter", "Either Ipv6Addresses or Ipv6Prefix must be specified.")
	}
	for _, a := range addrs {
		if !slices.Contains(e.ipv6, a) {
			return errorf("InvalidParameterValue", "Some of the specified IPv6 addresses are not assigned to interface %s", e.id)
		}
	}
	for _, p := range prefixes {
		if !slices.Contains(e.ipv6Prefixes, p) {
			return errorf("InvalidParameterValue", "Some of the specified IPv6 prefixes are not assigned to interface %s", e.id)
		}
	}
	c.subnets[e.subnetID].v6.releaseAll(addrs, prefixes)
	e.ipv6 = slices.DeleteFunc(e.ipv6, func(a netip.Addr) bool { return slices.Contains(addrs, a) })
	e.ipv6Prefixes = slices.DeleteFunc(e.ipv6Prefixes, func(p netip.Prefix) bool { return slices.Contains(prefixes, p) })
	c.recordIMDSLocked(e.inst)
	if c.observer != nil {
		c.observer.AddressesUnassigned(e.id, asPrefixes(addrs, prefixes))
	}
	return nil
}

type assignIPv6Reply struct {
	meta
	AssignedAddresses  []string `xml:"assignedIpv6Addresses>item"`
	AssignedPrefixes   []string `xml:"assignedIpv6PrefixSet>item"`
	NetworkInterfaceID string   `xml:"networkInterfaceId"`
}

// assignIPv6ActionLocked is EC2 AssignIpv6Addresses: NetworkInterfaceId and
// one of Ipv6AddressCount, Ipv6Addresses.N, Ipv6PrefixCount, Ipv6Prefix.N.
func (c *Cloud) assignIPv6ActionLocked(p params) (reply, *Error) {
	var req assign6Request
	var err *Error
	if req.eniID, err = p.required("NetworkInterfaceId"); err != nil {
		return nil, err
	}
	if req.count, err = p.intParam("Ipv6AddressCount", 0, 1, maxListEntries); err != nil {
		return nil, err
	}
	if req.prefixCount, err = p.intParam("Ipv6PrefixCount", 0, 1, maxListEntries); err != nil {
		return nil, err
	}
	if req.addrs, err = p.addr6List("Ipv6Addresses"); err != nil {
		return nil, err
	}
	if req.prefixes, err = p.prefix6List("Ipv6Prefix"); err != nil {
		return nil, err
	}
	addrs, prefixes, err := c.assignIPv6Locked(req)
	if err != nil {
		return nil, err
	}
	r := &assignIPv6Reply{NetworkInterfaceID: req.eniID, AssignedPrefixes: prefixStrings(prefixes)}
	for _, a := range addrs {
		r.AssignedAddresses = append(r.AssignedAddresses, a.String())
	}
	return r, nil
}

type unassignIPv6Reply struct {
	meta
	NetworkInterfaceID  string   `xml:"networkInterfaceId"`
	UnassignedAddresses []string `xml:"unassignedIpv6Addresses>item"`
	UnassignedPrefixes  []string `xml:"unassignedIpv6PrefixSet>item"`
}

// unassignIPv6ActionLocked is EC2 UnassignIpv6Addresses: NetworkInterfaceId
// and Ipv6Addresses.N and/or Ipv6Prefix.N.
func (c *Cloud) unassignIPv6ActionLocked(p params) (reply, *Error) {
	id, err := p.required("NetworkInterfaceId")
	if err != nil {
		return nil, err
	}
	addrs, err := p.addr6List("Ipv6Addresses")
	if err != nil {
		return nil, err
	}
	prefixes, err := p.prefix6List("Ipv6Prefix")
	if err != nil {
		return nil, err
	}
	addrs, prefixes = dedupe(addrs), dedupe(prefixes)
	if err := c.unassignIPv6Locked(id, addrs, prefixes); err != nil {
		return nil, err
	}
	r := &unassignIPv6Reply{NetworkInterfaceID: id, UnassignedPrefixes: prefixStrings(prefixes)}
	for _, a := range addrs {
		r.UnassignedAddresses = append(r.UnassignedAddresses, a.String())
	}
	return r, nil
}

// addr6List parses the "prefix.N" IPv6 addresses.
func (p params) addr6List(prefix string) ([]netip.Addr, *Error) {
	vals, err := p.list(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(vals))
	for _, s := range vals {
		a, perr := netip.ParseAddr(s)
		if perr != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
			return nil, errorf("InvalidParameterValue", "Invalid IPv6 address %q for %s.", s, prefix)
		}
		out = append(out, a)
	}
	return out, nil
}

// prefix6List parses the "prefix.N" IPv6 prefixes.
func (p params) prefix6List(prefix string) ([]netip.Prefix, *Error) {
	vals, err := p.list(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(vals))
	for _, s := range vals {
		pf, perr := netip.ParsePrefix(s)
		if perr != nil || !pf.Addr().Is6() || pf.Addr().Is4In6() {
			return nil, errorf("InvalidParameterValue", "Invalid IPv6 prefix %q for %s.", s, prefix)
		}
		out = append(out, pf)
	}
	return out, nil
}
