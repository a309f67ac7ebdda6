package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/routing"
	"golang.org/x/sys/unix"
)

// iptables chains owned by vpcip. Nothing else writes to them; EnsureSNAT
// rewrites them to its spec and RemoveSNAT deletes them.
const (
	// ChainConnmark (mangle, jumped to from PREROUTING at position 1) sets
	// the connection mark on connections entering by the primary ENI to a
	// local address (NodePort), sends new pod connections through
	// ChainEgress, and restores the connection mark onto packets arriving on
	// any other link, so rule routing.PriorityMark routes them by the main table.
	ChainConnmark = "VPCIP-CONNMARK"
	// ChainEgress (mangle, jumped to from ChainConnmark; absent with external
	// SNAT) returns for VPC and excluded CIDRs and marks every other new pod
	// connection: it leaves the VPC and must leave by the primary ENI.
	ChainEgress = "VPCIP-EGRESS"
	// ChainSNAT (nat, appended to POSTROUTING; absent with external SNAT)
	// returns for VPC and excluded CIDRs and SNATs the rest, leaving by the
	// primary link from a non-local source (a pod), to the primary address.
	ChainSNAT = "VPCIP-SNAT"
)

// DefaultMark is the connection-mark bit used when SNATConfig.Mark is 0
// (0x80, the value AWS VPC CNI users already keep free of other marks).
const DefaultMark uint32 = 0x80

// iptMu serializes rule convergence within the process: two concurrent
// EnsureSNAT calls would otherwise both see a rule missing and both add it
// (B28). iptables' own lock only covers one command.
var iptMu sync.Mutex

// lockedIPTables returns an iptables handle for the current netns with iptMu
// held; the caller runs unlock when its rules have converged. Errs when the
// iptables binary cannot be found or run.
func lockedIPTables() (ipt *iptables.IPTables, unlock func(), err error) {
	ipt, err = iptables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("iptables: %w", err)
	}
	iptMu.Lock()
	return ipt, iptMu.Unlock, nil
}

// SNATPorts is how the SNAT rule picks a connection's source port on the
// primary address, AWS_VPC_K8S_CNI_RANDOMIZESNAT's values and meaning.
type SNATPorts string

const (
	// SNATPortsRandomFully adds --random-fully (a PRNG picks each port;
	// needs iptables ≥ 1.6.2, else --random as below).
	SNATPortsRandomFully SNATPorts = "prng"
	// SNATPortsHashRandom adds --random (the port range offset comes from a
	// hash of the connection's addresses).
	SNATPortsHashRandom SNATPorts = "hashrandom"
	// SNATPortsNone adds no flag: the kernel keeps the pod's source port
	// when it is free on the primary address.
	SNATPortsNone SNATPorts = "none"
)

// SNATConfig is the node's SNAT and connection-mark spec (docs/design.md §4).
type SNATConfig struct {
	VPCCIDRs     []netip.Prefix // IPv4 CIDRs of the VPC (IMDS vpc-ipv4-cidr-blocks); traffic to them keeps the pod source
	ExcludeCIDRs []netip.Prefix // more destinations that keep the pod source (AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS)
	PrimaryIP    netip.Addr     // SNAT source: the primary ENI's primary private IPv4 address
	PrimaryLink  string         // name of the primary ENI's link, e.g. "eth0"
	Ports        SNATPorts      // how SNAT picks source ports (AWS_VPC_K8S_CNI_RANDOMIZESNAT); empty means SNATPortsRandomFully
	External     bool           // AWS_VPC_K8S_CNI_EXTERNALSNAT: no SNAT and no egress marks; pod traffic leaves by its own ENI
	Mark         uint32         // connection-mark bits; 0 means DefaultMark
	SysctlNet    string         // the node's net sysctl directory (VPCIP_SYSCTL_NET_DIR); "" is DefaultSysctlNet
}

func (c SNATConfig) mark() uint32 {
	if c.Mark == 0 {
		return DefaultMark
	}
	return c.Mark
}

func (c SNATConfig) validate() error {
	var errs []error
	if c.PrimaryLink == "" {
		errs = append(errs, errors.New("primary link name is empty"))
	}
	if !c.External {
		if !c.PrimaryIP.Is4() {
			errs = append(errs, fmt.Errorf("primary IP %v: want an IPv4 address", c.PrimaryIP))
		}
		if len(c.VPCCIDRs) == 0 {
			errs = append(errs, errors.New("no VPC CIDR: SNAT would rewrite traffic inside the VPC"))
		}
	}
	for _, p := range append(append([]netip.Prefix(nil), c.VPCCIDRs...), c.ExcludeCIDRs...) {
		if !p.IsValid() || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("CIDR %v: want an IPv4 prefix", p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("SNAT config: %w", err)
	}
	return nil
}

// EnsureSNAT makes the node's SNAT and connection-mark setup match c, in the
// current netns:
//   - rp_filter loose (2) on c.PrimaryLink: packets entering it for a pod on
//     a secondary ENI (NodePort DNAT, B15; replies to SNATed egress, B17)
//     fail the strict reverse-path check, whose reverse lookup from the pod
//     address hits the pod's "from" rule and so the pod's ENI,
//   - the rule "fwmark <mark>/<mark> lookup main" at routing.PriorityMark,
//   - mangle ChainConnmark (always: NodePort replies keep their ENI),
//   - unless c.External: mangle ChainEgress and nat ChainSNAT, so a pod
//     connection to anything outside c.VPCCIDRs and c.ExcludeCIDRs is marked,
//     routed by the main table out of the primary link (even from a pod on a
//     secondary ENI, whose address the VPC's source/destination check would
//     otherwise drop there) and SNATed to c.PrimaryIP,
//   - with c.External: ChainEgress and ChainSNAT and their jumps removed.
//
// Each chain ends up holding exactly its spec, in order, and each jump exists
// exactly once however often EnsureSNAT runs; a rule from an earlier spec
// (another VPC CIDR, another mark) is replaced without a moment where the
// chain lacks its new rules. Needs the iptables binary (go-iptables runs it).
func EnsureSNAT(c SNATConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	ipt, unlock, err := lockedIPTables()
	if err != nil {
		return err
	}
	defer unlock()
	if err := ensureLooseRPFilter(c.SysctlNet, c.PrimaryLink); err != nil {
		return fmt.Errorf("rp_filter on %s: %w", c.PrimaryLink, err)
	}
	if err := ensureMarkRule(c.mark()); err != nil {
		return fmt.Errorf("rule fwmark %#x lookup main: %w", c.mark(), err)
	}
	rs := snatRules(c, ipt.HasRandomFully())
	if !c.External {
		for _, ch := range []struct{ table, chain string }{{"mangle", ChainEgress}, {"nat", ChainSNAT}} {
			if err := convergeChain(ipt, ch.table, ch.chain, rs.chain(ch.table, ch.chain)); err != nil {
				return err
			}
		}
		if err := ensureJump(ipt, rs.snatJump, false); err != nil {
			return err
		}
	}
	if err := convergeChain(ipt, "mangle", ChainConnmark, rs.chain("mangle", ChainConnmark)); err != nil {
		return err
	}
	if err := ensureJump(ipt, rs.connmarkJump, true); err != nil {
		return err
	}
	if c.External {
		if err := removeChain(ipt, "nat", "POSTROUTING", ChainSNAT); err != nil {
			return err
		}
		if err := removeChain(ipt, "mangle", ChainConnmark, ChainEgress); err != nil {
			return err
		}
	}
	return nil
}

// RemoveSNAT deletes everything EnsureSNAT made except the rp_filter value:
// the jumps, ChainSNAT, ChainEgress, ChainConnmark and the fwmark rule at
// routing.PriorityMark. What is already gone is success.
func RemoveSNAT() error {
	ipt, unlock, err := lockedIPTables()
	if err != nil {
		return err
	}
	defer unlock()
	errs := []error{
		removeChain(ipt, "nat", "POSTROUTING", ChainSNAT),
		removeChain(ipt, "mangle", "PREROUTING", ChainConnmark),
		removeChain(ipt, "mangle", "", ChainEgress),
	}
	rules, err := markRules()
	errs = append(errs, err)
	for _, r := range rules {
		if err := netlink.RuleDel(&r); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("delete rule %v: %w", r, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove SNAT: %w", err)
	}
	return nil
}

// snatRuleSet is the iptables spec for one SNATConfig.
type snatRuleSet struct {
	rules        []rule // rules of our chains, in order per chain
	connmarkJump rule   // mangle PREROUTING → ChainConnmark
	snatJump     rule   // nat POSTROUTING → ChainSNAT
}

func (s snatRuleSet) chain(table, chain string) []rule {
	var out []rule
	for _, r := range s.rules {
		if r.table == table && r.chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// snatRules builds the iptables spec for c. It is pure, so the spec can be
// read and tested without root.
func snatRules(c SNATConfig, randomFully bool) snatRuleSet {
	m := fmt.Sprintf("%#x", c.mark())
	mm := m + "/" + m
	p := c.PrimaryLink
	var rs []rule
	add := func(table, chain, desc string, match, target []string) {
		rs = append(rs, rule{table: table, chain: chain, desc: desc, match: match, target: target})
	}
	add("mangle", ChainConnmark, "inbound on primary ENI, replies leave by it",
		[]string{"-i", p, "-m", "addrtype", "--dst-type", "LOCAL", "--limit-iface-in", "-m", "conntrack", "--ctstate", "NEW"},
		[]string{"-j", "CONNMARK", "--set-xmark", mm})
	if !c.External {
		add("mangle", ChainConnmark, "classify new pod connections",
			[]string{"!", "-i", p, "-m", "conntrack", "--ctstate", "NEW"}, []string{"-j", ChainEgress})
	}
	add("mangle", ChainConnmark, "restore mark for policy routing",
		[]string{"!", "-i", p}, []string{"-j", "CONNMARK", "--restore-mark", "--nfmask", m, "--ctmask", m})
	if !c.External {
		keep := append(append([]netip.Prefix(nil), c.VPCCIDRs...), c.ExcludeCIDRs...)
		for _, table := range []string{"mangle", "nat"} {
			chain := map[string]string{"mangle": ChainEgress, "nat": ChainSNAT}[table]
			for _, cidr := range keep {
				add(table, chain, "destination in VPC or excluded", []string{"-d", cidr.Masked().String()}, []string{"-j", "RETURN"})
			}
		}
		add("mangle", ChainEgress, "pod connection leaving the VPC", nil, []string{"-j", "CONNMARK", "--set-xmark", mm})
		snat := []string{"-j", "SNAT", "--to-source", c.PrimaryIP.String()}
		switch c.Ports {
		case SNATPortsNone:
		case SNATPortsHashRandom:
			snat = append(snat, "--random")
		default:
			if randomFully {
				snat = append(snat, "--random-fully")
			} else {
				snat = append(snat, "--random")
			}
		}
		add("nat", ChainSNAT, "pod traffic leaving the VPC",
			[]string{"-o", p, "-m", "addrtype", "!", "--src-type", "LOCAL"}, snat)
	}
	return snatRuleSet{
		rules:        rs,
		connmarkJump: rule{table: "mangle", chain: "PREROUTING", desc: "vpcip connection marks", target: []string{"-j", ChainConnmark}},
		snatJump:     rule{table: "nat", chain: "POSTROUTING", desc: "vpcip SNAT", target: []string{"-j", ChainSNAT}},
	}
}

// markRules lists the rules at routing.PriorityMark that send fwmarked packets to
// the main table: ours, whatever mark an earlier spec used.
func markRules() ([]netlink.Rule, error) {
	rs, err := netlinksafe.RuleListFiltered(netlink.FAMILY_V4,
		&netlink.Rule{Priority: routing.PriorityMark, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PRIORITY|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list rules at priority %d: %w", routing.PriorityMark, err)
	}
	var out []netlink.Rule
	for _, r := range rs {
		if r.Mark != 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

// ensureMarkRule keeps exactly one "fwmark mark/mark lookup main" rule at
// routing.PriorityMark; fwmark rules there with another mark are deleted.
func ensureMarkRule(mark uint32) error {
	have, err := markRules()
	if err != nil {
		return err
	}
	want := netlink.NewRule()
	want.Family = netlink.FAMILY_V4
	want.Priority = routing.PriorityMark
	want.Table = unix.RT_TABLE_MAIN
	want.Mark = mark
	mask := mark
	want.Mask = &mask
	return keepOneRule(have, want, func(r netlink.Rule) bool {
		return r.Mark == mark && r.Mask != nil && *r.Mask == mark && r.Src == nil && r.Dst == nil
	})
}
