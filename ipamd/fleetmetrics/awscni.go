package fleetmetrics

import (
	"net/netip"

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

// CIDRUse is one address block a node holds for pods and how many of its
// addresses pods hold: a /28 prefix (prefix delegation; EC2
// AssignPrivateIpAddresses Ipv4Prefixes) or a secondary IP as a /32.
type CIDRUse struct {
	CIDR     netip.Prefix
	Assigned int // addresses of CIDR held by pods
}

// awscniCollector reports the reference's gauges from one count per scrape,
// and its per-CIDR gauges from one list of the node's address blocks.
type awscniCollector struct {
	counts          func() api.Counts
	cidrs           func() []CIDRUse
	descs           []*prometheus.Desc
	prefixes, perIP *prometheus.Desc
}

// RegisterAWSCNINames registers the reference's awscni_* gauges
// (VPCIP_METRICS_AWSCNI_NAMES=true), computed at each scrape from counts,
// the daemon's pool counts (ipamd.Daemon.Status().Counts), and from cidrs,
// the node's address blocks (ipamd.Daemon.State()):
//
//	awscni_total_ipv4_prefixes          gauge  the /28 prefixes the node holds
//	awscni_assigned_ip_per_cidr{cidr}   gauge  addresses pods hold, per /28 prefix or secondary IP (/32)
func RegisterAWSCNINames(reg prometheus.Registerer, counts func() api.Counts, cidrs func() []CIDRUse) {
	c := &awscniCollector{counts: counts, cidrs: cidrs,
		prefixes: prometheus.NewDesc("awscni_total_ipv4_prefixes", "The total number of IPv4 /28 prefixes the node holds on its ENIs.", nil, nil),
		perIP: prometheus.NewDesc("awscni_assigned_ip_per_cidr", "The number of addresses pods hold, per /28 prefix or per secondary IP (as a /32).",
			[]string{"cidr"}, nil)}
	for _, g := range awscniGauges {
		c.descs = append(c.descs, prometheus.NewDesc(g.name, g.help, nil, nil))
	}
	reg.MustRegister(c)
}

func (c *awscniCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.prefixes
	ch <- c.perIP
}

func (c *awscniCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.counts()
	for i, g := range awscniGauges {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.GaugeValue, float64(g.value(s)))
	}
	prefixes := 0
	for _, u := range c.cidrs() {
		if u.CIDR.Addr().Is4() && u.CIDR.Bits() < 32 { // an IPv6 /80 is no IPv4 prefix
			prefixes++
		}
		ch <- prometheus.MustNewConstMetric(c.perIP, prometheus.GaugeValue, float64(u.Assigned), u.CIDR.String())
	}
	ch <- prometheus.MustNewConstMetric(c.prefixes, prometheus.GaugeValue, float64(prefixes))
}
