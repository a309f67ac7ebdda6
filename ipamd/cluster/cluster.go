// Package cluster is vpcipd's Kubernetes part (plain client-go): it watches the
// pods bound to this node and the Node itself, and from them supplies the rest
// of the daemon with facts (ipamd.PodFacts): pending demand (pods scheduled
// here that hold no address yet), the attachments whose pod is gone from the
// API server (leaks), and a change signal. It records Events that name why a
// pod got no address, and publishes the node's AddressBudget from the status
// the daemon hands it (ipamd.StatusSink, a nodestatus.Snapshot).
//
// Facts flow one way: the part never calls into the daemon, never touches
// the host and never releases an address itself; the daemon releases what
// PodsGone reports through its own host-checked release path. It imports
// none of the daemon's internals (a dependency test in test/deps pins it).
//
// It is a guest (docs/design.md §9): the daemon never waits for it. Run returns
// at once when MY_NODE_NAME is unset; with the API server unreachable it keeps
// retrying in the background, reports itself degraded (Health, the
// vpcip_kubernetes_connected gauge) and every method the daemon calls answers
// from what it last knew, or "nothing known", without blocking.
//
// API load per node (field failure K04): two field-selected watches (pods with
// spec.nodeName=<node>, the node with metadata.name=<node>), never a
// cluster-wide one; objects are kept without managedFields. Writes: the
// AddressBudget status only when it changed: at most once per PublishInterval
// (15 s) for a change a reader acts on, about once per CountsInterval
// (1 min) when only the pool's counts moved, the former counted against the
// latter so that together they stay at one a minute, plus a resync every
// ResyncInterval (10 min); Events through client-go's events recorder, which
// folds repeats into a series.
package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/provider"
)

// Options configure a Cluster. Zero durations take the defaults named.
type Options struct {
	NodeName string                // MY_NODE_NAME; "" disables the cluster part
	Config   *rest.Config          // how to reach the API server; nil disables the cluster part
	Logger   *slog.Logger          // nil: discard
	Metrics  prometheus.Registerer // nil: not registered
	// WithoutPod is vpcip_addresses_without_pod when the daemon registered
	// it (package fleetmetrics); nil registers it on Metrics.
	WithoutPod *fleetmetrics.WithoutPod
	// Subnets are the node's subnets with their free addresses
	// (fleetmetrics.Subnets.Latest: the daemon's one cached
	// DescribeSubnets, so publishing costs no EC2 call); nil: none shown.
	Subnets func() ([]provider.Subnet, time.Time)
	// LeakGrace is how long a pod must be absent from a synced cache before
	// a live list is asked and, absent there too, PodsGone reports its
	// attachment; default 2 min.
	LeakGrace time.Duration
	// PublishInterval is the least time between two AddressBudget status
	// writes; default 15 s. ResyncInterval forces a write; default 10 min.
	PublishInterval, ResyncInterval time.Duration
	// CountsInterval is the least time between two status writes that
	// change only the pool's counts (assigned, warm, cooling, used percent,
	// subnet free addresses, and the condition messages quoting them): the
	// counts shown are at most CountsInterval (plus a Tick) old, twice that
	// right after a change a reader acts on (a condition's status or
	// reason, ENIs, capacity, budget, readiness, pod subnet, versions),
	// which waits only PublishInterval and takes the next counts-only
	// write's turn. Default 1 min.
	CountsInterval time.Duration
	// Tick is how often the publisher and the leak check look; default 1 s.
	Tick time.Duration
	Now  func() time.Time // nil: time.Now
}

// Cluster is the running Kubernetes part. The zero value is not usable; a nil
// *Cluster is (every method then reports "disabled").
type Cluster struct {
	o       Options
	log     *slog.Logger
	metrics *metrics
	api     apiClients

	pods, nodes cache.SharedIndexInformer
	events      *recorder

	changed chan struct{} // capacity 1: demand rose or a pod was confirmed gone (Changed)

	mu      sync.Mutex           // guards the fields below
	state   string               // "", "disabled: ...", "connecting", "degraded: ..."
	lastErr time.Time            // last watch or API error
	latest  *nodestatus.Snapshot // the daemon's last published status; nil before the first
	leaks   leakState
	pub     publishState
}

// apiClients are the Cluster's ways to the API server, set once by wire
// (nil cs: the part is disabled).
type apiClients struct {
	cs      kubernetes.Interface
	budgets *addressbudget.Client
	probe   func(context.Context) error // asks the API server whether it answers (checkHealth)
}

// leakState is what leak detection (checkLeaks) remembers between ticks.
type leakState struct {
	goneAt    map[api.Key]time.Time // held attachments whose pod is missing from the synced cache, since when
	confirmed map[api.Key]bool      // held attachments whose pod a live list confirmed gone (PodsGone)
}

// Health is the cluster part's condition for logs, metrics and `vpcipctl status`.
type Health struct {
	Enabled   bool   // MY_NODE_NAME and an API config were given
	Connected bool   // caches synced and no API error outstanding
	Reason    string // why not connected, or ""
}

// ErrDisabled: no node name or no API config; the daemon runs without the part.
var ErrDisabled = errors.New("kubernetes integration disabled")

// New wires a Cluster; it does no I/O. With no node name or no config it
// returns a Cluster that reports itself disabled and whose Run returns at once.
func New(o Options) (*Cluster, error) {
	return newCluster(o, (*Cluster).wire)
}

// newCluster is New with the wiring of the clients given (wire, or in tests
// client-go's fake clientsets through wireClients).
func newCluster(o Options, wire func(*Cluster) error) (*Cluster, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.LeakGrace <= 0 {
		o.LeakGrace = 2 * time.Minute
	}
	if o.PublishInterval <= 0 {
		o.PublishInterval = 15 * time.Second
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 10 * time.Minute
	}
	if o.CountsInterval <= 0 {
		o.CountsInterval = time.Minute
	}
	if o.Tick <= 0 {
		o.Tick = time.Second
	}
	c := &Cluster{o: o, log: o.Logger, metrics: newMetrics(o.Metrics, o.WithoutPod), changed: make(chan struct{}, 1),
		leaks: leakState{goneAt: map[api.Key]time.Time{}, confirmed: map[api.Key]bool{}}}
	switch {
	case o.NodeName == "":
		c.state = "disabled: MY_NODE_NAME unset"
	case o.Config == nil:
		c.state = "disabled: no API server configuration (not in a cluster and KUBECONFIG unset)"
	default:
		if err := wire(c); err != nil {
			return nil, err
		}
		c.state = "connecting to the API server"
	}
	c.metrics.setConnected(false)
	return c, nil
}

// Health reports whether the part is enabled and connected, and why not.
func (c *Cluster) Health() Health {
	if c == nil {
		return Health{Reason: ErrDisabled.Error()}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := Health{Enabled: c.api.cs != nil, Connected: c.state == "", Reason: c.state}
	if h.Reason == "" {
		h.Reason = c.pub.err
	}
	return h
}

func (c *Cluster) enabled() bool { return c != nil && c.api.cs != nil }

// Run watches and publishes until ctx ends. It returns nil at once when the
// part is disabled; otherwise it never fails: API errors are retried and
// reported through Health.
func (c *Cluster) Run(ctx context.Context) error {
	if !c.enabled() {
		c.log.Info("kubernetes integration off", "reason", c.Health().Reason)
		<-ctx.Done()
		return nil
	}
	c.log.Info("kubernetes integration starting", "node", c.o.NodeName, "apiServer", c.o.Config.Host)
	stop := c.events.start(ctx)
	defer stop()
	go c.pods.RunWithContext(ctx)
	go c.nodes.RunWithContext(ctx)
	go c.waitSynced(ctx)
	tick := time.NewTicker(c.o.Tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			c.step(ctx)
		}
	}
}

// step is one look: health, leaks, the published budget. Both need the
// daemon's status (PublishStatus); before the first there is nothing to do.
func (c *Cluster) step(ctx context.Context) {
	c.checkHealth(ctx)
	c.mu.Lock()
	snap := c.latest
	c.mu.Unlock()
	if snap == nil {
		return
	}
	if c.synced() {
		c.checkLeaks(ctx, *snap)
	}
	publisher{c}.publish(ctx, *snap)
}

// PublishStatus takes the daemon's status (ipamd.StatusSink): the AddressBudget
// is rendered from it and leak detection judges its Held attachments, at the
// next tick. It returns at once.
func (c *Cluster) PublishStatus(s nodestatus.Snapshot) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.latest = &s
	c.mu.Unlock()
}

// Changed receives when pending demand rose (a pod needing an address was
// bound here) or a pod was newly confirmed gone; repeats fold into one. Nil
// on a nil Cluster (never receives).
func (c *Cluster) Changed() <-chan struct{} {
	if c == nil {
		return nil
	}
	return c.changed
}

// signal notes a change for Changed without blocking.
func (c *Cluster) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *Cluster) waitSynced(ctx context.Context) {
	if cache.WaitForCacheSync(ctx.Done(), c.pods.HasSynced, c.nodes.HasSynced) {
		c.mu.Lock()
		if c.lastErr.IsZero() || c.state == "connecting to the API server" {
			c.state = ""
		}
		c.mu.Unlock()
		c.metrics.setConnected(c.Health().Connected)
		c.log.Info("kubernetes caches synced", "node", c.o.NodeName)
	}
}

// synced reports whether the caches are synced and no API error is
// outstanding: only then do demand and leak detection trust them.
func (c *Cluster) synced() bool {
	if !c.enabled() || !c.pods.HasSynced() || !c.nodes.HasSynced() {
		return false
	}
	return c.Health().Connected
}

// apiError records a failed watch or call: the part is degraded until a probe
// succeeds (checkHealth).
func (c *Cluster) apiError(what string, err error) {
	c.mu.Lock()
	first := !strings.HasPrefix(c.state, "degraded")
	c.lastErr = c.o.Now()
	c.state = "degraded: " + what + ": " + err.Error()
	c.leaks.goneAt = map[api.Key]time.Time{} // absences seen so far are no evidence now
	clear(c.leaks.confirmed)
	c.mu.Unlock()
	c.metrics.setConnected(false)
	c.metrics.apiErrors.Inc()
	if first {
		c.log.Warn("kubernetes API unreachable: cluster features degraded, addresses still served", "what", what, "err", err)
	}
}

// checkHealth probes the API server (GET /version, allowed to every identity)
// while degraded, and clears the degradation when it answers and the caches
// are synced.
func (c *Cluster) checkHealth(ctx context.Context) {
	h := c.Health()
	if h.Connected || !c.pods.HasSynced() || !c.nodes.HasSynced() {
		return
	}
	c.mu.Lock()
	recent := c.o.Now().Sub(c.lastErr) < 5*time.Second
	c.mu.Unlock()
	if recent {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.api.probe(pctx); err != nil {
		c.apiError("probe", err)
		return
	}
	c.mu.Lock()
	c.state = ""
	c.mu.Unlock()
	c.metrics.setConnected(true)
	c.log.Info("kubernetes API reachable again", "node", c.o.NodeName)
}
