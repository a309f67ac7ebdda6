package datapath

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// wantedRules are the policy rules of one pod address.
func wantedRules(a Attachment) []netlink.Rule {
	to := netlink.NewRule()
	to.Family = netlink.FAMILY_V4
	to.Priority = PriorityToPod
	to.Dst = host32(a.PodIP)
	to.Table = mainTable
	rules := []netlink.Rule{*to}
	if a.RouteTable != 0 {
		from := netlink.NewRule()
		from.Family = netlink.FAMILY_V4
		from.Priority = PriorityFromPod
		from.Src = host32(a.PodIP)
		from.Table = a.RouteTable
		rules = append(rules, *from)
	}
	return rules
}

// rulesFor lists the rules this package owns for addr: priority 512 "to
// addr/32" and priority 1536 "from addr/32", whatever their table. It never
// matches a rule without an address (B14: no wildcard deletions).
func rulesFor(addr netip.Addr) ([]netlink.Rule, error) {
	all, err := netlinksafe.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	var out []netlink.Rule
	for _, r := range all {
		switch {
		case r.Priority == PriorityToPod && r.Src == nil && isHost32(r.Dst, addr):
			out = append(out, r)
		case r.Priority == PriorityFromPod && r.Dst == nil && isHost32(r.Src, addr):
			out = append(out, r)
		}
	}
	return out, nil
}

// containsRule reports whether rules holds one with r's priority, selector
// and table.
func containsRule(rules []netlink.Rule, r netlink.Rule) bool {
	for _, h := range rules {
		if h.Priority == r.Priority && h.Table == r.Table && sameNet(h.Src, r.Src) && sameNet(h.Dst, r.Dst) {
			return true
		}
	}
	return false
}

func sameNet(a, b *net.IPNet) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.String() == b.String()
}

// describeRule renders r like `ip rule` does, for messages.
func describeRule(r netlink.Rule) string {
	sel := "all"
	switch {
	case r.Src != nil:
		sel = "from " + r.Src.String()
	case r.Dst != nil:
		sel = "to " + r.Dst.String()
	}
	table := fmt.Sprint(r.Table)
	if r.Table == mainTable {
		table = "main"
	}
	return fmt.Sprintf("%d: %s lookup %s", r.Priority, sel, table)
}
