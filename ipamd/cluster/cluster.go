// Package cluster is vpcipd's Kubernetes part (plain client-go): it watches the
// pods bound to this node and the Node itself, and from them supplies the rest
// of the daemon with pending demand (pods scheduled here that hold no address
// yet), finds assignments whose pod is gone (leaks), records Events that name
// why a pod got no address, and publishes the node's AddressBudget.
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
// AddressBudget status only when it changed, at most once per PublishInterval
// (15 s) plus a resync every ResyncInterval (5 min); Events through client-go's
// events recorder, which folds repeats into a series.
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
	"github.com/vpcip/vpcip/ipamd/introspect"
)

// Daemon is what the cluster part reads from, and asks of, the rest of vpcipd.
type Daemon interface {
	// Snapshot is the node's pool and assignments now. It must not block on
	// the cloud.
	Snapshot() Snapshot
	// ReleaseLeaked releases a's address if it is still held by a.Key and
	// the host shows no trace of its pod (no host veth, no route to the
	// address: the checks GC uses). It reports whether it released, and why
	// not otherwise.
	ReleaseLeaked(a Assignment) (released bool, why string)
	// PodsHolding returns "namespace/name" of every pod holding an address
	// now; cheap enough for every pool cycle.
	PodsHolding() map[string]bool
}

// Snapshot is the daemon's state as the cluster part publishes it. Address
// counts are pod addresses, as in introspect.Pool.
type Snapshot struct {
	Ready                          bool
	InstanceID, InstanceType, Zone string
	PrefixMode                     bool
	Assigned, Warm, Cooling        int
	Capacity, Budget               int
	ENIs, MaxENIs                  int
	Subnets                        []addressbudget.Subnet // the node's subnets with their free addresses (cached)
	Version                        string                 // vpcipd version
	CheckpointSchema               int
	Assignments                    []Assignment
	PodSubnet                      *addressbudget.PodSubnet // the latest ENI placement; nil before the first
	// SandboxNetns is whether the daemon sees the sandboxes' netns (its
	// witness that a pod went without a DEL); nil when unknown.
	SandboxNetns *introspect.SandboxNetns
}

// Assignment is one held address as leak detection sees it.
type Assignment struct {
	Key        api.Key
	Pod        api.Pod // namespace, name, UID from CNI_ARGS; empty when unknown
	AssignedAt time.Time
}

// Options configure a Cluster. Zero durations take the defaults named.
type Options struct {
	NodeName string       // MY_NODE_NAME; "" disables the cluster part
	Config   *rest.Config // how to reach the API server; nil disables the cluster part
	Daemon   Daemon
	Logger   *slog.Logger          // nil: discard
	Metrics  prometheus.Registerer // nil: not registered
	// WithoutPod is vpcip_addresses_without_pod when the daemon registered
	// it (package fleetmetrics); nil registers it on Metrics.
	WithoutPod *fleetmetrics.WithoutPod
	// Kick is called when pending demand rises, so the pool grows at once.
	Kick func()
	// LeakGrace is how long a pod must be absent from a synced cache (and
	// from a live list) before its assignment is released; default 2 min.
	LeakGrace time.Duration
	// PublishInterval is the least time between two AddressBudget status
	// writes; default 15 s. ResyncInterval forces a write; default 5 min.
	PublishInterval, ResyncInterval time.Duration
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
	cs      kubernetes.Interface
	budgets *addressbudget.Client

	pods, nodes cache.SharedIndexInformer
	events      *recorder

	mu         sync.Mutex            // guards the fields below
	state      string                // "", "disabled: ...", "connecting", "degraded: ..."
	lastErr    time.Time             // last watch or API error
	goneAt     map[api.Key]time.Time // assignments whose pod is missing from the synced cache, since when
	lastDemand int
	pub        publishState
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
		o.ResyncInterval = 5 * time.Minute
	}
	if o.Tick <= 0 {
		o.Tick = time.Second
	}
	c := &Cluster{o: o, log: o.Logger, metrics: newMetrics(o.Metrics, o.WithoutPod), goneAt: map[api.Key]time.Time{}}
	switch {
	case o.NodeName == "":
		c.state = "disabled: MY_NODE_NAME unset"
	case o.Config == nil:
		c.state = "disabled: no API server configuration (not in a cluster and KUBECONFIG unset)"
	case o.Daemon == nil:
		return nil, errors.New("cluster: Options.Daemon is required")
	default:
		if err := c.wire(); err != nil {
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
	h := Health{Enabled: c.cs != nil, Connected: c.state == "", Reason: c.state}
	if h.Reason == "" {
		h.Reason = c.pub.err
	}
	return h
}

func (c *Cluster) enabled() bool { return c != nil && c.cs != nil }

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

// step is one look: health, demand, leaks, the published budget.
func (c *Cluster) step(ctx context.Context) {
	c.checkHealth(ctx)
	snap := c.o.Daemon.Snapshot()
	if c.synced() {
		c.noticeDemand(snap)
		c.checkLeaks(ctx, snap)
	}
	c.publish(ctx, snap)
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
	c.goneAt = map[api.Key]time.Time{} // absences seen so far are no evidence now
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
	if _, err := c.cs.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(pctx); err != nil {
		c.apiError("probe", err)
		return
	}
	c.mu.Lock()
	c.state = ""
	c.mu.Unlock()
	c.metrics.setConnected(true)
	c.log.Info("kubernetes API reachable again", "node", c.o.NodeName)
}

// SetKick sets Options.Kick after New (the daemon that owns Kick is built
// after its Kubernetes part). Call it before Run.
func (c *Cluster) SetKick(kick func()) {
	if c != nil {
		c.o.Kick = kick
	}
}

// KubernetesState is Health in introspection's shape (`vpcipctl status`).
func (c *Cluster) KubernetesState() introspect.Kubernetes {
	h := c.Health()
	return introspect.Kubernetes{Enabled: h.Enabled, Connected: h.Connected, Reason: h.Reason}
}
