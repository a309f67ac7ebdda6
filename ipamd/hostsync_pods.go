package ipamd

import (
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
)

// removeStaleRules deletes the per-pod policy rules of addresses that no pod
// holds and no host route leads to: left by a pod that vanished without a
// DEL, or by a DEL that could not finish. A rule is never left pointing at
// an address the pool may hand to another pod (B13). An ADD holds its
// address before the plugin adds rules, and a DEL's rules go with or after
// its route, so neither races this.
func (h *hostSync) removeStaleRules(byAddr map[netip.Addr]string) {
	addrs, err := h.host.PodRuleAddresses()
	if err != nil {
		h.log.Warn("host policy rules unreadable", "err", err)
		return
	}
	for _, a := range addrs {
		if _, routed := byAddr[a]; routed {
			continue
		}
		if _, held := h.store.Holder(a); held {
			continue
		}
		n, err := h.host.RemovePodRules(a)
		if err != nil {
			h.log.Error("removing stale pod rules failed", "address", a, "err", err)
			continue
		}
		if n > 0 {
			h.metrics.repaired("stale_pod_rules", n)
			h.log.Warn("removed policy rules of an address no pod holds", "address", a, "rules", n)
		}
	}
}

// releaseRouteless releases assignments whose pod route has been gone on two
// checks in a row (see checkPods) and removes their pods' policy rules. It
// runs on the worker goroutine, which alone touches noRoute: no lock is held,
// least of all across the netlink calls.
func (h *hostSync) releaseRouteless(byAddr map[netip.Addr]string, now time.Time) {
	assigned := h.store.Assignments()
	gone := h.routeless(assigned, byAddr, now)
	// Pods leave through DEL; many routes vanishing at once more likely
	// means a broken host view than dead pods. Freeing their addresses
	// would hand live pods' addresses out again, so do not trust it.
	if limit := max(2, len(assigned)/2); len(gone) > limit {
		h.log.Error("host shows no route for too many pods at once: not releasing on its word",
			"podsWithoutRoute", len(gone), "assigned", len(assigned))
		return
	}
	for _, a := range gone {
		delete(h.noRoute, a.Key)
		if _, ok := h.store.Release(a.Key, now); ok {
			h.metrics.repaired("released_no_route", 1)
			// The pod went without a DEL: its veth and host route went with
			// its netns, but the plugin's rules stay in the node netns.
			rules, err := h.host.RemovePodRules(a.Address)
			if err != nil {
				h.log.Error("removing the released address's pod rules failed", "address", a.Address, "err", err)
			}
			h.log.Warn("released an address whose pod route is gone", "key", a.Key.String(), "address", a.Address, "rulesRemoved", rules)
		}
	}
}

// routeless counts, per assignment, the checks in a row without a host
// route (past VPCIP_GC_GRACE) and returns those at two.
func (h *hostSync) routeless(assigned []datastore.Assignment, byAddr map[netip.Addr]string, now time.Time) []datastore.Assignment {
	seen := map[api.Key]bool{}
	var gone []datastore.Assignment
	for _, a := range assigned {
		seen[a.Key] = true
		if _, ok := byAddr[a.Address]; ok || now.Sub(a.AssignedAt) < h.cfg.GCGrace {
			delete(h.noRoute, a.Key)
			continue
		}
		h.noRoute[a.Key]++
		if h.noRoute[a.Key] >= 2 {
			gone = append(gone, a)
		}
	}
	for k := range h.noRoute {
		if !seen[k] {
			delete(h.noRoute, k)
		}
	}
	return gone
}
