package cluster

import "github.com/prometheus/client_golang/prometheus"

// metrics of the cluster part (docs/design.md §8 naming).
type metrics struct {
	connected     prometheus.Gauge
	withoutPod    prometheus.Gauge
	pendingPods   prometheus.Gauge
	apiErrors     prometheus.Counter
	writes        *prometheus.CounterVec
	events        *prometheus.CounterVec
	leaksReleased prometheus.Counter
	leakMismatch  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcip_kubernetes_connected",
			Help: "1 when the Kubernetes part's caches are synced and the API server answers; 0 when disabled, connecting or degraded (addresses are served either way).",
		}),
		withoutPod: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcip_addresses_without_pod",
			Help: "Assigned addresses whose pod (namespace/name/UID) is missing from the node's synced pod cache: candidate leaks, released after the leak grace period.",
		}),
		pendingPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcip_pending_pods",
			Help: "Pods bound to this node, not host-network, not terminal, that hold no address yet (demand the pool sizes for).",
		}),
		apiErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpcip_kubernetes_api_errors_total",
			Help: "Failed Kubernetes API watches, lists and probes.",
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_kubernetes_writes_total",
			Help: "Kubernetes API writes by the daemon, by kind (addressbudget_create, addressbudget_update, addressbudget_status) and outcome (ok, error).",
		}, []string{"kind", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpcip_kubernetes_events_total",
			Help: "Events recorded (before client-go folds repeats into series), by reason.",
		}, []string{"reason"}),
		leaksReleased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpcip_leaked_addresses_released_total",
			Help: "Addresses released because their pod was gone from the API server past the grace period and the host showed no trace of it.",
		}),
		leakMismatch: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpcip_leak_check_mismatches_total",
			Help: "Pods missing from the cache but present in a live list from the API server (a stale cache caught before any release).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.withoutPod, m.pendingPods, m.apiErrors, m.writes, m.events, m.leaksReleased, m.leakMismatch)
	}
	return m
}

func (m *metrics) setConnected(ok bool) {
	if ok {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}
