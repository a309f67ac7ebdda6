package ipamd

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
)

// The host checks' fences (datastore.Fencer).
const (
	fenceStaleRules datastore.Fencer = "stale-rules"
	fenceRouteless  datastore.Fencer = "route-less"
)

// removeStaleRules deletes the per-pod policy rules of addresses that no pod
// holds and no host route leads to: left by a pod that vanished without a
// DEL, or by a DEL that could not finish. A rule is never left pointing at
// an address the pool may hand to another pod (B13). The address is fenced
// while its rules go, so no ADD is given it meanwhile (the rules removed
// could be its new ones), and stays fenced while they cannot be removed
// (until a later check finds them gone); an address the store
// does not know is not handed out at all (the store learns addresses on
// this goroutine).
func (h *hostSync) removeStaleRules(byAddr map[netip.Addr]string) {
	addrs, err := h.host.PodRuleAddresses()
	if err != nil {
		h.log.Warn("host policy rules unreadable", "err", err)
		return
	}
	// An address left fenced by a removal that reported an error whose
	// rules are gone now (the error came after the kernel deleted them, or
	// someone else removed them) is handed out again.
	for _, a := range h.store.Fences().FencedBy(fenceStaleRules) {
		if !slices.Contains(addrs, a) {
			h.store.Fences().Unfence(a, fenceStaleRules)
		}
	}
	for _, a := range addrs {
		if _, routed := byAddr[a]; routed {
			continue
		}
		fenced := h.store.Fences().Fence(a, fenceStaleRules)
		if _, held := h.store.Holder(a); !fenced && held {
			continue // a pod's: its rules are its own
		}
		// The vanished pod's conntrack entries go before the address is
		// handed out again.
		h.store.Conntrack().MarkUnflushed(a)
		n, err := h.host.RemovePodRules(a)
		if err != nil {
			// Fenced until a later check removes them.
			h.log.Error("removing stale pod rules failed; the address is not handed out until they go", "address", a, "err", err)
			continue
		}
		if fenced {
			h.store.Fences().Unfence(a, fenceStaleRules)
		}
		if n > 0 {
			h.metrics.repaired("stale_pod_rules", n)
			h.log.Warn("removed policy rules of an address no pod holds", "address", a, "rules", n)
		}
	}
}

// releaseRouteless releases assignments whose pod route has been gone on two
// checks in a row (see checkPods), after removing their pods' policy rules:
// the pod went without a DEL, its veth and host route went with its netns,
// but the plugin's rules stay in the node netns. They go first, while the
// address is still held, so no ADD can have been given it and its new
// rules cannot be the ones removed (B13); a removal that fails keeps the
// address held, and the next check tries again. (Its conntrack entries are
// flushed before the address is reused.) It runs on the worker goroutine,
// which alone touches noRoute: no lock is held, least of all across the
// netlink calls.
func (h *hostSync) releaseRouteless(byAddr map[netip.Addr]string, now time.Time) {
	assigned := h.store.Assignments()
	gone := h.confirmGone(h.routeless(assigned, byAddr, now), assigned, byAddr)
	for _, a := range gone {
		released, err := h.releaseGone(a, now, fenceRouteless, "released an address whose pod route is gone")
		if err == nil {
			delete(h.noRoute, a.Key) // released, or released meanwhile (a late DEL)
		}
		if released {
			h.metrics.repaired("released_no_route", 1)
		}
	}
}

// releaseGone is the one release of an address whose pod went without a
// DEL (its host route is gone; the caller judged the pod gone): its pod
// rules are removed first, while the address is still held and fenced by
// by, so no ADD can have been given it and its new rules cannot be the ones
// removed (B13), also when a late DEL of the key releases it meanwhile with
// IP_COOLDOWN_PERIOD=0; then a is released, then unfenced. A removal that
// fails keeps the address held and is returned; a that no longer holds its
// address is neither released nor an error. what is the log message of a
// release. No lock is held across the host call.
func (h *hostSync) releaseGone(a datastore.Assignment, now time.Time, by datastore.Fencer, what string) (released bool, err error) {
	if !h.store.Fences().FenceHeld(a.Key, a.Address, by) {
		return false, nil // released meanwhile (a late DEL)
	}
	defer h.store.Fences().Unfence(a.Address, by)
	rules, err := h.host.RemovePodRules(a.Address)
	if err != nil {
		h.log.Error("removing the pod rules of an address whose pod is gone failed; kept held, tried again at the next check",
			"key", a.Key.String(), "address", a.Address, "err", err)
		return false, err
	}
	if _, ok := h.store.ReleaseHeld(a.Key, a.Address, now); !ok {
		return false, nil
	}
	h.log.Warn(what, "key", a.Key.String(), "pod", a.Pod.Namespace+"/"+a.Pod.Name, "address", a.Address, "rulesRemoved", rules)
	return true, nil
}

// confirmGone decides which route-less assignments to release: those the
// netns witness confirms gone (see netnsWitness), however many went at once
// (a crash-looping pod, a runtime restart, a node reboot). A pod whose
// route vanished while its sandbox lives keeps its address, and so does
// one the witness cannot judge (no netns path recorded, or its directory
// not visible to the daemon, and no veth to judge by): freeing a live pod's address is the worst
// outcome, and DEL or the Kubernetes part's leak check (the API server's
// word that the pod is gone) still release those.
func (h *hostSync) confirmGone(gone, assigned []datastore.Assignment, byAddr map[netip.Addr]string) []datastore.Assignment {
	seen := h.witness.seen(assigned, byAddr)
	h.setWitness(h.witness.state(seen))
	var confirmed []datastore.Assignment
	for _, a := range gone {
		if h.witness.gone(a, seen, h.host.LinkExists) {
			confirmed = append(confirmed, a)
		}
	}
	// Logged when the number kept changes, not at every check.
	if kept := len(gone) - len(confirmed); kept != h.keptUnconfirmed {
		h.keptUnconfirmed = kept
		if kept > 0 {
			h.log.Warn("pods without a host route kept: their netns cannot confirm they are gone (DEL or the Kubernetes leak check releases them)",
				"pods", kept, "netnsDirsSeen", len(seen))
		}
	}
	return confirmed
}

// report logs and counts what FromHost changed. A conflict means the
// checkpoint was older than the host (written by another build or restored
// from a copy): the address stays held for the sandbox the host routes it
// to, never handed out.
func (h *hostSync) report(rep datastore.HostReport) {
	if n := len(rep.Recovered); n > 0 {
		h.metrics.repaired("recovered_from_host", n)
		for _, a := range rep.Recovered {
			h.log.Warn("address routed to a pod but not in the checkpoint: held for it", "address", a.Address,
				"hostVeth", a.HostVeth, "key", a.Key.String())
		}
	}
	if n := len(rep.Identified); n > 0 {
		h.metrics.repaired("recovered_identified", n)
		for _, a := range rep.Identified {
			h.log.Info("re-held address matched to its sandbox by the veth's record", "address", a.Address, "key", a.Key.String())
		}
	}
	if n := len(rep.Conflicts); n > 0 {
		h.metrics.repaired("checkpoint_conflict", n)
		for _, c := range rep.Conflicts {
			h.log.Error("checkpoint conflicts with the host: an address recorded for one attachment is routed to another sandbox; the host wins",
				"address", c.Address, "recorded", c.Recorded.String(), "hostVeth", c.HostVeth, "sandbox", c.Sandbox.String(), "heldFor", c.Now.String())
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
