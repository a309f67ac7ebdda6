package cluster

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
)

// metrics of the cluster part (docs/design.md §8 naming). The count of
// addresses released for pods gone from the API server
// (vpcip_leaked_addresses_released_total) is the daemon's: it releases them.
type metrics struct {
	connected    prometheus.Gauge
	withoutPod   *fleetmetrics.WithoutPod
	pendingPods  prometheus.Gauge
	apiErrors    prometheus.Counter
	writes       *prometheus.CounterVec
	events       *prometheus.CounterVec
	leakMismatch prometheus.Counter
}

// newMetrics registers the part's metrics on reg (nil: none). withoutPod is
// vpcip_addresses_without_pod when the daemon registered it already; nil
// registers it here.
func newMetrics(reg prometheus.Registerer, withoutPod *fleetmetrics.WithoutPod) *metrics {
	if withoutPod == nil && reg != nil {
		withoutPod = fleetmetrics.NewWithoutPod(reg)
	}
	m := &metrics{withoutPod: withoutPod,
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpcip_kubernetes_connected",
			Help: "1 when the Kubernetes part's caches are synced and the API server answers; 0 when disabled, connecting or degraded (addresses are served either way).",
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
		leakMismatch: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpcip_leak_check_mismatches_total",
			Help: "Pods missing from the cache but present in a live list from the API server (a stale cache caught before any release).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.pendingPods, m.apiErrors, m.writes, m.events, m.leakMismatch)
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
