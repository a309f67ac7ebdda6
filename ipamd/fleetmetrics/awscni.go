package fleetmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/ipamd/api"
)

// The AWS VPC CNI's gauge names (its ipamd's /metrics on port 61678), with
// the reference's meanings expressed in our pool's terms. Only the gauges:
// the reference's counters lack the _total suffix that Prometheus naming
// (and promtool) ask for, and ours (vpcip_*_total) replace them.
var awscniGauges = []struct {
	name, help string
	value      func(api.Counts) int
}{
	{"awscni_assigned_ip_addresses", "The number of IP addresses assigned to pods (vpcip_addresses_assigned).",
		func(s api.Counts) int { return s.Assigned }},
	{"awscni_total_ip_addresses", "The total number of IP addresses the node holds for pods: assigned, free and in cooldown, ENI primary addresses excluded (vpcip_addresses_assigned + _warm + _cooling).",
		func(s api.Counts) int { return s.Assigned + s.Warm + s.Cooling }},
	{"awscni_ip_max", "The maximum number of IP addresses that can be allocated to the instance: the budget at the ENI limit (vpcip_addresses_budget).",
		func(s api.Counts) int { return s.Budget }},
	{"awscni_eni_allocated", "The number of ENIs allocated (attached) that hold pod addresses: the primary is not counted under custom networking (vpcip_enis_attached).",
		func(s api.Counts) int { return s.ENIs }},
	{"awscni_eni_max", "The maximum number of ENIs that can be attached to the instance, capped by MAX_ENI (vpcip_enis_max).",
		func(s api.Counts) int { return s.MaxENIs }},
}

// awscniCollector reports the reference's gauges from one count per scrape.
type awscniCollector struct {
	counts func() api.Counts
	descs  []*prometheus.Desc
}

// RegisterAWSCNINames registers the reference's awscni_* gauges
// (VPCIP_METRICS_AWSCNI_NAMES=true), computed at each scrape from counts,
// the daemon's pool counts (ipamd.Daemon.Status().Counts).
func RegisterAWSCNINames(reg prometheus.Registerer, counts func() api.Counts) {
	c := &awscniCollector{counts: counts}
	for _, g := range awscniGauges {
		c.descs = append(c.descs, prometheus.NewDesc(g.name, g.help, nil, nil))
	}
	reg.MustRegister(c)
}

func (c *awscniCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *awscniCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.counts()
	for i, g := range awscniGauges {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.GaugeValue, float64(g.value(s)))
	}
}
