package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// ChainIMDS (filter, jumped to from FORWARD and INPUT at position 1 for
// packets to IMDSAddr) returns for the pod addresses allowed to reach the
// instance metadata service and rejects every other packet arriving from a
// pod veth. Both parent chains are needed: on EC2 a pod's packet to IMDS is
// routed out of an ENI (FORWARD); where the metadata address is local to the
// node's netns (vpcsim, or a proxy listening on it) it is delivered locally
// (INPUT). The node's own processes and hostNetwork pods send from the node's
// netns (OUTPUT, then INPUT on lo) and never match: they keep IMDS.
const ChainIMDS = "VPCIP-IMDS"

// IMDSAddr is the IPv4 address of the EC2 instance metadata service (EC2
// User Guide, "Access instance metadata": 169.254.169.254).
var IMDSAddr = netip.MustParseAddr("169.254.169.254")

// IMDSAddr6 is IMDS's IPv6 address on Nitro instances (EC2 User Guide,
// "Access instance metadata": fd00:ec2::254).
var IMDSAddr6 = netip.MustParseAddr("fd00:ec2::254")

// IMDSAllowed is a pod address whose packets to IMDS are let through, with
// the pod it belongs to (namespace/name), shown in the rule's comment. On an
// IPv6-mode node (IMDSConfig.IPv6) Addr is the pod's IPv6 address and Veth
// its host veth: the pod's IPv4 egress address is host-local's, unknown to
// the daemon, so its IPv4 packets are let through by the veth they enter by.
type IMDSAllowed struct {
	Addr netip.Addr
	Pod  string
	Veth string // IPv6 mode only
}

// IMDSConfig is the node's pod-to-IMDS policy.
type IMDSConfig struct {
	// VethPrefix is the host veth name prefix of pods
	// (AWS_VPC_K8S_CNI_VETHPREFIX): packets entering by "<prefix>+" are pod
	// packets.
	VethPrefix string
	// Allowed are the pod addresses that may reach IMDS; every other pod's
	// packets to IMDSAddr are rejected (ICMP port unreachable: a TCP connect
	// fails at once with "connection refused").
	Allowed []IMDSAllowed
	// IPv6 is a node in IPv6 mode: pods' IPv6 packets to IMDSAddr6 are
	// filtered as their IPv4 ones (pods' IPv4 egress) to IMDSAddr, by the
	// same chain in ip6tables' filter table (ICMPv6 port unreachable);
	// Allowed addresses are IPv6 and carry their Veth.
	IPv6 bool
}

func (c IMDSConfig) validate() error {
	var errs []error
	if c.VethPrefix == "" || strings.ContainsAny(c.VethPrefix, " +!") || len(c.VethPrefix) > 14 {
		errs = append(errs, fmt.Errorf("veth prefix %q: want 1 to 14 characters without spaces, + or !", c.VethPrefix))
	}
	for _, a := range c.Allowed {
		switch {
		case !c.IPv6 && !a.Addr.Is4():
			errs = append(errs, fmt.Errorf("allowed address %v: want IPv4", a.Addr))
		case c.IPv6 && (!a.Addr.Is6() || a.Addr.Is4In6()):
			errs = append(errs, fmt.Errorf("allowed address %v: want IPv6 (IPv6 mode)", a.Addr))
		case c.IPv6 && (a.Veth == "" || strings.ContainsAny(a.Veth, " +!") || len(a.Veth) > 15):
			errs = append(errs, fmt.Errorf("allowed address %v: host veth %q: want an interface name (IPv6 mode)", a.Addr, a.Veth))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("IMDS config: %w", err)
	}
	return nil
}

// imdsRules is the spec of ChainIMDS and its two jumps in iptables. Pure, so
// the spec is tested without root. Allowed addresses come first, sorted, one
// RETURN each: by source address, or in IPv6 mode by the pod's host veth
// (its IPv4 egress).
func imdsRules(c IMDSConfig) (chain []rule, jumps []rule) {
	return imdsFamilyRules(c, false)
}

// imdsRules6 is the spec of ChainIMDS and its two jumps in ip6tables (IPv6
// mode): the allowed pods' IPv6 addresses, then the REJECT, for IMDSAddr6.
func imdsRules6(c IMDSConfig) (chain []rule, jumps []rule) {
	return imdsFamilyRules(c, true)
}

func imdsFamilyRules(c IMDSConfig, v6 bool) (chain []rule, jumps []rule) {
	allowed := slices.Clone(c.Allowed)
	slices.SortFunc(allowed, func(a, b IMDSAllowed) int { return a.Addr.Compare(b.Addr) })
	for i, a := range allowed {
		if i > 0 && allowed[i-1].Addr == a.Addr {
			continue
		}
		match := []string{"-s", netip.PrefixFrom(a.Addr, a.Addr.BitLen()).String()}
		if c.IPv6 && !v6 {
			match = []string{"-i", a.Veth}
		}
		chain = append(chain, rule{table: "filter", chain: ChainIMDS, desc: "pod " + commentSafe(a.Pod) + " may reach IMDS",
			match: match, target: []string{"-j", "RETURN"}})
	}
	reject, imds := "icmp-port-unreachable", IMDSAddr
	if v6 {
		reject, imds = "icmp6-port-unreachable", IMDSAddr6
	}
	chain = append(chain, rule{table: "filter", chain: ChainIMDS, desc: "pods may not reach IMDS",
		match: []string{"-i", c.VethPrefix + "+"}, target: []string{"-j", "REJECT", "--reject-with", reject}})
	dst := []string{"-d", netip.PrefixFrom(imds, imds.BitLen()).String()}
	for _, parent := range []string{"FORWARD", "INPUT"} {
		jumps = append(jumps, rule{table: "filter", chain: parent, desc: "vpcip pod access to IMDS",
			match: dst, target: []string{"-j", ChainIMDS}})
	}
	return chain, jumps
}

// commentSafe keeps a pod name fit for an iptables comment (at most 256
// bytes, no quotes).
func commentSafe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '"' || r == '\'' || r == '\\' || r < ' ' || r > '~' {
			return '_'
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// EnsureIMDSBlock makes the node's pod-to-IMDS filter match c, in the current
// netns: filter ChainIMDS holds one RETURN per allowed pod address, then the
// REJECT of every other packet entering by a pod veth; FORWARD and INPUT
// each jump to it, first, for destination IMDSAddr. The jumps go in only
// after the chain holds its spec, and a changed spec is converged in place
// (new rules inserted ahead of stale ones), so there is no moment where a
// pod that should be blocked is not. Needs the iptables binary.
func EnsureIMDSBlock(c IMDSConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	ipt, unlock, err := lockedIPTables()
	if err != nil {
		return err
	}
	defer unlock()
	chain, jumps := imdsRules(c)
	if err := ensureIMDSChain(ipt, chain, jumps); err != nil {
		return err
	}
	if !c.IPv6 {
		return nil
	}
	ipt6, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6))
	if err != nil {
		return fmt.Errorf("ip6tables: %w", err)
	}
	chain, jumps = imdsRules6(c)
	return ensureIMDSChain(ipt6, chain, jumps)
}

func ensureIMDSChain(ipt *iptables.IPTables, chain, jumps []rule) error {
	if err := convergeChain(ipt, "filter", ChainIMDS, chain); err != nil {
		return err
	}
	for _, j := range jumps {
		if err := ensureJump(ipt, j, true); err != nil {
			return err
		}
	}
	return nil
}

// RemoveIMDSBlock deletes the jumps from FORWARD and INPUT and ChainIMDS,
// in iptables and, where the ip6tables command exists, in ip6tables: pods
// reach IMDS as the node does (VPCIP_IMDS_POD_ACCESS=all, or the node
// leaving vpcip). What is already gone is success.
func RemoveIMDSBlock() error {
	ipt, unlock, err := lockedIPTables()
	if err != nil {
		return err
	}
	defer unlock()
	tables := []*iptables.IPTables{ipt}
	if ipt6, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6)); err == nil {
		tables = append(tables, ipt6)
	}
	for _, t := range tables {
		err = errors.Join(err,
			removeJumps(t, "filter", "FORWARD", ChainIMDS),
			removeJumps(t, "filter", "INPUT", ChainIMDS),
			removeChain(t, "filter", "", ChainIMDS))
	}
	if err != nil {
		return fmt.Errorf("remove IMDS block: %w", err)
	}
	return nil
}

// removeJumps deletes every rule of parent that jumps to chain.
func removeJumps(ipt *iptables.IPTables, table, parent, chain string) error {
	pos, _, err := jumpPositions(ipt, table, parent, chain)
	if err != nil {
		return err
	}
	for i := len(pos) - 1; i >= 0; i-- {
		if err := ipt.DeleteById(table, parent, pos[i]); err != nil {
			return fmt.Errorf("delete jump %s %s -> %s: %w", table, parent, chain, err)
		}
	}
	return nil
}
