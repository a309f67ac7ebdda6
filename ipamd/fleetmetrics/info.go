package fleetmetrics

import (
	"runtime"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterBuildInfo registers vpcip_build_info: always 1, labelled with the
// daemon's version, the Go release it was built with and the checkpoint
// schema it writes, so a fleet's versions can be counted
// (count by (version) (vpcip_build_info)).
func RegisterBuildInfo(reg prometheus.Registerer, version string, checkpointSchema int) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vpcip_build_info",
		Help: "Always 1; the labels name the running vpcipd's version, Go release and checkpoint schema.",
		ConstLabels: prometheus.Labels{
			"version":           version,
			"go_version":        runtime.Version(),
			"checkpoint_schema": strconv.Itoa(checkpointSchema),
		},
	}, func() float64 { return 1 }))
}

// WithoutPod is vpcip_addresses_without_pod: assigned addresses whose pods
// the Kubernetes API server no longer lists. The daemon's Kubernetes part
// computes it and calls Set; without that part it stays 0.
type WithoutPod struct{ n atomic.Int64 }

// NewWithoutPod registers the gauge on reg, at 0.
func NewWithoutPod(reg prometheus.Registerer) *WithoutPod {
	w := &WithoutPod{}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vpcip_addresses_without_pod",
		Help: "Assigned addresses whose pods the Kubernetes API server no longer lists (0 when the daemon's Kubernetes part is off).",
	}, func() float64 { return float64(w.n.Load()) }))
	return w
}

// Set records the current count of addresses held without a live pod.
// Safe for concurrent use; a nil WithoutPod ignores it.
func (w *WithoutPod) Set(n int) {
	if w != nil {
		w.n.Store(int64(n))
	}
}
