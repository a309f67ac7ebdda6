package routing

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Inside a pod's netns (docs/design.md §4) the pod's default attachment
// (CNI_IFNAME eth0) holds the main table's link-local gateway and default
// route. Every other attachment of the pod (Multus net1, ...) is routed by
// source instead, so wiring it never replaces the pod's default route:
//
//	1536  from <attachment address>/32 lookup <AttachmentTableBase + ifindex>
//
// with the attachment's gateway and default routes in that table, ifindex
// being the pod interface's index in the pod netns (unique there, stable for
// the interface's life). Connections bound to the attachment's address and
// replies to connections that came in on it leave by its own interface.

// AttachmentTableBase is added to a pod interface's index for the route
// table of a non-default attachment inside the pod netns.
const AttachmentTableBase = 1000

// AttachmentTable is the route table, inside the pod netns, of the
// non-default attachment whose pod interface has index ifindex.
func AttachmentTable(ifindex int) int { return AttachmentTableBase + ifindex }

// AttachmentRule is the source rule, inside the pod netns, of a
// non-default attachment at addr (IPv4) routed by table: "from addr/32
// lookup table" at PriorityFromPod.
func AttachmentRule(addr netip.Addr, table int) netlink.Rule {
	r := netlink.NewRule()
	r.Family = netlink.FAMILY_V4
	r.Priority = PriorityFromPod
	r.Src = host32(addr)
	r.Table = table
	return *r
}

// attachmentRules lists the source rules of addr at PriorityFromPod in h's
// netns, whatever their table.
func attachmentRules(h *netlink.Handle, addr netip.Addr) ([]netlink.Rule, error) {
	all, err := listRules(h)
	if err != nil {
		return nil, err
	}
	var out []netlink.Rule
	for _, r := range all {
		if a, ok := host32Addr(r.Src); ok && a == addr && r.Priority == PriorityFromPod && r.Dst == nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// EnsureAttachmentRuleVia makes the source rules of addr in h's netns (the
// pod netns) exactly AttachmentRule(addr, table): one left with another
// table (an earlier interface index) is deleted, a missing one added.
func EnsureAttachmentRuleVia(h *netlink.Handle, addr netip.Addr, table int) error {
	want := AttachmentRule(addr, table)
	have, err := attachmentRules(h, addr)
	if err != nil {
		return err
	}
	for _, r := range have {
		if !SameRule(r, want) {
			if err := via(h).RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove stale pod rule %s: %w", Describe(r), err)
			}
		}
	}
	if slices.ContainsFunc(have, func(r netlink.Rule) bool { return SameRule(r, want) }) {
		return nil
	}
	if err := via(h).RuleAdd(&want); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add pod rule %s: %w", Describe(want), err)
	}
	return nil
}

// HasAttachmentRuleVia reports whether h's netns holds AttachmentRule(addr,
// table).
func HasAttachmentRuleVia(h *netlink.Handle, addr netip.Addr, table int) (bool, error) {
	have, err := attachmentRules(h, addr)
	want := AttachmentRule(addr, table)
	return slices.ContainsFunc(have, func(r netlink.Rule) bool { return SameRule(r, want) }), err
}

// RemoveAttachmentRulesVia deletes every source rule of addr at
// PriorityFromPod in h's netns (the pod netns). Rules already gone are
// success.
func RemoveAttachmentRulesVia(h *netlink.Handle, addr netip.Addr) error {
	rules, err := attachmentRules(h, addr)
	if err != nil {
		return err
	}
	for _, r := range rules {
		if err := via(h).RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("delete pod rule %s: %w", Describe(r), err)
		}
	}
	return nil
}
