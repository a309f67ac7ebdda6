package ipamd

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/provider"
)

// Metrics are vpcipd's Prometheus metrics (docs/design.md §8): prefix vpcip_, base
// units, counters ending in _total, small fixed label sets. Create them with
// NewMetrics before the provider, so the provider's CallObserver can be
// ObserveCall; the pool gauges are added by New. Every part of the daemon
// counts into it; it has no lock of its own (the Prometheus types are safe
// for concurrent use).
type Metrics struct {
	reg         prometheus.Registerer
	addWait     prometheus.Histogram
	releases    prometheus.Counter
	noAddress   *prometheus.CounterVec
	calls       *prometheus.CounterVec
	callLatency *prometheus.HistogramVec
	repairs     *prometheus.CounterVec
	checkpoints *prometheus.CounterVec
	actions     *prometheus.CounterVec
	netnsSeen   prometheus.Gauge
	// leaksReleased counts addresses released because the Kubernetes part
	// confirmed their pod gone (goneReleaser).
	leaksReleased prometheus.Counter
}

// NewMetrics registers the daemon's counters and histograms on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
		addWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vpcip_add_wait_seconds",
			Help:    "Time an address request (CNI ADD) waited for an address, answered or not.",
			Buckets: []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10},
		}),
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpcip_release_requests_total",
			Help: "Address release requests (CNI DEL), whether or not the attachment held an address.",
		}),
		noAddress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_add_no_address_total",
			Help: "Address requests answered with no address, by cause (eni-limit, subnet-full, no-contiguous-prefix, throttled, waiting-for-cloud, max-pods, not-ready).",
		}, []string{"cause"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_provider_calls_total",
			Help: "Cloud API calls by operation and outcome (ok, throttled, error, or the refusal's name).",
		}, []string{"operation", "outcome"}),
		callLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vpcip_provider_call_duration_seconds",
			Help:    "Cloud API call latency including retries, by operation.",
			Buckets: []float64{0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"operation"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_reconcile_repairs_total",
			Help: "Differences reconciliation found and repaired, by kind.",
		}, []string{"kind"}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_checkpoint_writes_total",
			Help: "Checkpoint writes by outcome (ok, error, not_durable: in place but the directory fsync failed).",
		}, []string{"outcome"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_pool_actions_total",
			Help: "Warm-pool actions executed, by action (assign, create_eni, release, delete_eni) and outcome (ok, error; deferred: growth whose place in the fleet's shared EC2 budget is held, made when due; held: a /28 request not sent because EC2 refused one and the subnet view shows no whole /28 since).",
		}, []string{"action", "outcome"}),
		netnsSeen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcip_sandbox_netns_visible",
			Help: "1 when vpcipd sees the pod sandboxes' netns directory, so an address whose pod went without a DEL is released after VPCIP_GC_GRACE; 0: such addresses stay held until the Kubernetes leak check releases them.",
		}),
		leaksReleased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpcip_leaked_addresses_released_total",
			Help: "Addresses released because their pod was gone from the API server past the grace period and the host showed no trace of it.",
		}),
	}
	reg.MustRegister(m.addWait, m.releases, m.noAddress, m.calls, m.callLatency, m.repairs, m.checkpoints, m.actions, m.netnsSeen, m.leaksReleased)
	// Every cause and kind starts at 0: a counter series born at its first
	// increment shows no rate() or increase() for it, so the first refusal or
	// repair would never reach a dashboard or alert.
	for _, c := range noAddressCauses {
		m.noAddress.WithLabelValues(string(c))
	}
	for _, k := range repairKinds {
		m.repairs.WithLabelValues(k)
	}
	return m
}

// noAddressCauses are the cause label values of vpcip_add_no_address_total.
var noAddressCauses = []api.Cause{
	api.CauseENILimit, api.CauseSubnetFull, api.CauseThrottled, api.CauseWaitingCloud,
	api.CauseMaxPods, api.CauseNoPrefix, api.CauseCooldown, "not-ready",
}

// repairKinds are the kind label values of vpcip_reconcile_repairs_total,
// one per repair the daemon makes (a test keeps the list complete).
var repairKinds = []string{
	"adopted_address", "adopted_eni", "checkpoint_conflict", "checkpoint_entry_dropped", "corrupt_checkpoint",
	"foreign_checkpoint", "forgotten_address", "forgotten_eni", "gc_released",
	"kept_assigned_address", "leaked_eni_deleted", "recovered_adopted", "recovered_from_host",
	"recovered_identified", "released_no_route", "stale_pod_rules",
}

// ObserveCall is a provider.CallObserver.
func (m *Metrics) ObserveCall(operation, outcome string, latency time.Duration) {
	m.calls.WithLabelValues(operation, outcome).Inc()
	if outcome != "throttled" { // a throttled attempt is followed by the call's final report
		m.callLatency.WithLabelValues(operation).Observe(latency.Seconds())
	}
}

var _ provider.CallObserver = (*Metrics)(nil).ObserveCall

// witness records whether the netns witness sees the sandboxes.
func (m *Metrics) witness(available bool) {
	v := 0.0
	if available {
		v = 1
	}
	m.netnsSeen.Set(v)
}

func (m *Metrics) repaired(kind string, n int) {
	if n > 0 {
		m.repairs.WithLabelValues(kind).Add(float64(n))
	}
}

// poolCollector reports the pool gauges from one consistent count per scrape
// (api.Counts, through the status endpoint's api.Status).
type poolCollector struct {
	status func() api.Status
	descs  map[string]*prometheus.Desc
}

var poolGauges = []struct{ name, help string }{
	{"vpcip_addresses_assigned", "Addresses held by pods."},
	{"vpcip_addresses_warm", "Free addresses out of cooldown, ready to assign now."},
	{"vpcip_addresses_cooling", "Released addresses still in IP_COOLDOWN_PERIOD."},
	{"vpcip_addresses_capacity", "Addresses the attached ENIs could hold at most."},
	{"vpcip_addresses_budget", "Addresses the node could hold at its ENI limit."},
	{"vpcip_enis_attached", "ENIs attached to the node that hold pod addresses: every attached ENI except the primary under custom networking (the same basis as vpcip_enis_max)."},
	{"vpcip_enis_max", "ENIs for pod addresses the instance type allows (without the primary under custom networking), capped by MAX_ENI."},
	{"vpcip_ready", "1 when the daemon can assign addresses, else 0."},
}

func newPoolCollector(status func() api.Status) *poolCollector {
	c := &poolCollector{status: status, descs: map[string]*prometheus.Desc{}}
	for _, g := range poolGauges {
		c.descs[g.name] = prometheus.NewDesc(g.name, g.help, nil, nil)
	}
	return c
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.status()
	ready := 0.0
	if s.Ready {
		ready = 1
	}
	values := map[string]float64{
		"vpcip_addresses_assigned": float64(s.Assigned),
		"vpcip_addresses_warm":     float64(s.Warm),
		"vpcip_addresses_cooling":  float64(s.Cooling),
		"vpcip_addresses_capacity": float64(s.Capacity),
		"vpcip_addresses_budget":   float64(s.Budget),
		"vpcip_enis_attached":      float64(s.ENIs),
		"vpcip_enis_max":           float64(s.MaxENIs),
		"vpcip_ready":              ready,
	}
	for name, v := range values {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v)
	}
}
