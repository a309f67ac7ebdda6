package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PodRules is the exact set of policy rules of a pod at addr (IPv4) whose
// address lives on the ENI routed by table: "to addr/32 lookup main" at
// PriorityToPod, and for a secondary ENI (table neither 0 nor MainTable)
// "from addr/32 lookup table" at PriorityFromPod.
func PodRules(addr netip.Addr, table int) []netlink.Rule {
	to := netlink.NewRule()
	to.Family = netlink.FAMILY_V4
	to.Priority = PriorityToPod
	to.Dst = host32(addr)
	to.Table = MainTable
	rules := []netlink.Rule{*to}
	if table != 0 && table != MainTable {
		from := netlink.NewRule()
		from.Family = netlink.FAMILY_V4
		from.Priority = PriorityFromPod
		from.Src = host32(addr)
		from.Table = table
		rules = append(rules, *from)
	}
	return rules
}

// PodRuleAddr returns the pod address r is a pod rule of: a rule at
// PriorityToPod selecting only "to <addr>/32", or at PriorityFromPod
// selecting only "from <addr>/32", whatever its table. Any other rule,
// including one without an address, is not a pod rule (no wildcard
// deletions: docs/field-failures.md B14).
func PodRuleAddr(r netlink.Rule) (netip.Addr, bool) {
	switch {
	case r.Priority == PriorityToPod && r.Src == nil:
		return host32Addr(r.Dst)
	case r.Priority == PriorityFromPod && r.Dst == nil:
		return host32Addr(r.Src)
	}
	return netip.Addr{}, false
}

// SameRule reports whether a and b have the same priority, selectors and
// table: what `ip rule` would show as one rule.
func SameRule(a, b netlink.Rule) bool {
	return a.Priority == b.Priority && a.Table == b.Table && sameNet(a.Src, b.Src) && sameNet(a.Dst, b.Dst)
}

func sameNet(a, b *net.IPNet) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.String() == b.String()
}

// Describe renders r like `ip rule` does, for messages:
// "1536: from 10.0.1.7/32 lookup 2".
func Describe(r netlink.Rule) string {
	sel := "all"
	switch {
	case r.Src != nil:
		sel = "from " + r.Src.String()
	case r.Dst != nil:
		sel = "to " + r.Dst.String()
	}
	table := fmt.Sprint(r.Table)
	if r.Table == MainTable {
		table = "main"
	}
	return fmt.Sprintf("%d: %s lookup %s", r.Priority, sel, table)
}

// pkg is the netlink package's own API as a handle: a socket per request,
// in the calling thread's netns.
var pkg = &netlink.Handle{}

// via is h, or the package API when h is nil.
func via(h *netlink.Handle) *netlink.Handle {
	if h == nil {
		return pkg
	}
	return h
}

// listRules lists the IPv4 rules of h's netns (the current one when h is
// nil). The kernel marks a dump interrupted when rules change during it;
// netlinksafe's handle retries it and, when every attempt was interrupted,
// returns the error rather than a possibly incomplete list (its
// package-level RuleList would return the list): a rule missing from it
// would be a rule left behind.
func listRules(h *netlink.Handle) ([]netlink.Rule, error) {
	nh := netlinksafe.Handle{Handle: via(h)}
	rs, err := nh.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	return rs, nil
}

// FindPodRules lists the pod rules of addr (PodRuleAddr) in the current
// netns, whatever their table.
func FindPodRules(addr netip.Addr) ([]netlink.Rule, error) {
	return findPodRules(nil, addr)
}

func findPodRules(h *netlink.Handle, addr netip.Addr) ([]netlink.Rule, error) {
	all, err := listRules(h)
	if err != nil {
		return nil, err
	}
	var out []netlink.Rule
	for _, r := range all {
		if a, ok := PodRuleAddr(r); ok && a == addr {
			out = append(out, r)
		}
	}
	return out, nil
}

// PodRuleAddresses lists the addresses the current netns has pod rules for,
// sorted, without repeats.
func PodRuleAddresses() ([]netip.Addr, error) {
	all, err := listRules(nil)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, r := range all {
		if a, ok := PodRuleAddr(r); ok {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// DiffPodRules compares the pod rules of addr in the current netns with
// PodRules(addr, table): missing are wanted but absent, stale are pod rules
// of addr that are not wanted (another table, left by an earlier owner of
// the address).
func DiffPodRules(addr netip.Addr, table int) (missing, stale []netlink.Rule, err error) {
	return diffPodRules(nil, addr, table)
}

func diffPodRules(h *netlink.Handle, addr netip.Addr, table int) (missing, stale []netlink.Rule, err error) {
	want := PodRules(addr, table)
	have, err := findPodRules(h, addr)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range have {
		if !slices.ContainsFunc(want, func(w netlink.Rule) bool { return SameRule(w, r) }) {
			stale = append(stale, r)
		}
	}
	for _, r := range want {
		if !slices.ContainsFunc(have, func(h netlink.Rule) bool { return SameRule(h, r) }) {
			missing = append(missing, r)
		}
	}
	return missing, stale, nil
}

// EnsurePodRules makes the pod rules of addr exactly PodRules(addr, table):
// stale ones (DiffPodRules) are deleted, missing ones added; an identical
// existing rule is success (docs/field-failures.md B28).
func EnsurePodRules(addr netip.Addr, table int) error {
	return EnsurePodRulesVia(nil, addr, table)
}

// EnsurePodRulesVia is EnsurePodRules through the netlink handle h (its
// socket and netns; the package API when nil), so a caller making several
// requests opens one socket for all of them.
func EnsurePodRulesVia(h *netlink.Handle, addr netip.Addr, table int) error {
	missing, stale, err := diffPodRules(h, addr, table)
	if err != nil {
		return err
	}
	for _, r := range stale {
		if err := via(h).RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove stale rule %s: %w", Describe(r), err)
		}
	}
	for _, r := range missing {
		if err := via(h).RuleAdd(&r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add rule %s: %w", Describe(r), err)
		}
	}
	return nil
}

// RemovePodRules deletes the pod rules of addr, whatever their table, and
// returns how many it deleted. Rules already gone are success; a non-IPv4
// addr has none.
func RemovePodRules(addr netip.Addr) (int, error) {
	return RemovePodRulesVia(nil, addr)
}

// RemovePodRulesVia is RemovePodRules through the netlink handle h (its
// socket and netns; the package API when nil).
func RemovePodRulesVia(h *netlink.Handle, addr netip.Addr) (int, error) {
	if !addr.Is4() {
		return 0, nil
	}
	rules, err := findPodRules(h, addr)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rules {
		if err := via(h).RuleDel(&r); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
				continue
			}
			return n, fmt.Errorf("delete rule %s: %w", Describe(r), err)
		}
		n++
	}
	return n, nil
}
