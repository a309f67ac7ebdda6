package ipamd

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
)

// PodFacts is what the Kubernetes part (package ipamd/cluster) tells the
// daemon about the pods bound to this node. Facts flow one way: the daemon
// asks, the part answers from what it last knew, never blocking on the API
// server; what the part knows of the daemon comes only through the status
// sink (StatusSink, Snapshot.Held). Without the part (Options.Pods nil) the
// daemon works on the ADDs and host checks alone.
type PodFacts interface {
	// Unaddressed counts the pods bound to this node that need an address
	// and hold none; holds reports whether the daemon holds one for a pod
	// (it must not block). 0 while the part has no trustworthy view
	// (disabled, unsynced, degraded).
	Unaddressed(holds func(api.Pod) bool) int
	// PodsGone returns the attachment keys, among those last published in
	// Snapshot.Held, whose pod the API server no longer has: absent from
	// the part's synced cache for its grace (VPCIP_POD_LEAK_GRACE) and
	// from a live list after it. A pod of the same name with another UID
	// counts as gone.
	PodsGone() []api.Key
	// Changed receives when pending demand rose or a pod was newly
	// confirmed gone; repeats fold into one (capacity 1). The daemon then
	// runs a pool cycle, and releases what PodsGone reports.
	Changed() <-chan struct{}
}

// podDemand is the pool's demand input (pool.Demand) from PodFacts: the pods
// the part reports without an address, judged by the datastore's holders
// (namespace/name from CNI_ARGS).
type podDemand struct {
	facts PodFacts
	store *datastore.Store
}

func (d podDemand) Demand() int {
	type podName struct{ namespace, name string }
	held := map[podName]bool{}
	for _, a := range d.store.Assignments() {
		if a.Pod.Name != "" {
			held[podName{a.Pod.Namespace, a.Pod.Name}] = true
		}
	}
	return d.facts.Unaddressed(func(p api.Pod) bool { return held[podName{p.Namespace, p.Name}] })
}

// Live implements pool.LiveDemand: the part's view is trustworthy now, when
// its PodFacts say so (a Live method: vpcipd's liveFacts, from the part's
// Health); facts without Live are taken as not live.
func (d podDemand) Live() bool {
	l, ok := d.facts.(interface{ Live() bool })
	return ok && l.Live()
}

// fenceLeak is goneReleaser's fence (datastore.Fencer): it holds the
// address off other pods while its pod rules go.
const fenceLeak datastore.Fencer = "leak"

// goneReleaser releases the addresses of pods the Kubernetes part confirmed
// gone from the API server, through hostSync's release path (pod rules
// first, then the address: releaseGone) and only while the host shows no
// trace of the pod: no host route leads to the address, so its veth and
// netns are gone with it. Without a host view (NoHost) nothing is released.
// It runs on the worker goroutine alone: after each reconciliation and when
// the part signals (PodFacts.Changed).
type goneReleaser struct {
	facts   PodFacts // nil: nothing to release
	hosts   *hostSync
	store   *datastore.Store
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time
	kept    map[api.Key]bool // gone pods whose address the host still routes, logged once
}

// run releases what PodsGone reports and the host confirms.
func (g *goneReleaser) run() {
	if g.facts == nil {
		return
	}
	keys := g.facts.PodsGone()
	if len(keys) == 0 {
		clear(g.kept)
		return
	}
	routes, err := g.hosts.host.PodRoutes()
	if err != nil {
		if !errors.Is(err, ErrNoHostView) {
			g.log.Warn("host pod routes unreadable: addresses of pods gone from the API server kept", "err", err)
		}
		return
	}
	byAddr := make(map[netip.Addr]string, len(routes))
	for _, r := range routes {
		byAddr[r.Address] = r.HostVeth
	}
	now := g.now()
	still := map[api.Key]bool{}
	for _, k := range keys {
		a, ok := g.store.Get(k)
		if !ok {
			continue // released meanwhile (a late DEL, CNI GC)
		}
		if veth, routed := byAddr[a.Address]; routed {
			still[k] = true
			if !g.kept[k] {
				g.log.Info("address of a pod gone from the API server kept: the host still routes it to a veth",
					"key", k.String(), "pod", a.Pod.Namespace+"/"+a.Pod.Name, "address", a.Address, "hostVeth", veth)
			}
			continue
		}
		if released, _ := g.hosts.releaseGone(a, now, fenceLeak, "released the address of a pod gone from the API server without a DEL"); released {
			g.metrics.leaksReleased.Inc()
		}
	}
	g.kept = still
}
