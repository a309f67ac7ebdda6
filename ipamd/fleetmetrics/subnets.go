package fleetmetrics

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/provider"
)

// DefaultSubnetInterval is how often each daemon asks EC2 for its subnets'
// free addresses. EC2 throttles each non-mutating action per account and
// region with a bucket of 100 requests refilled at 20 per second
// (docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html): 5,000
// nodes asking every 30 minutes make 2.8 DescribeSubnets calls per second,
// 14% of that refill, one call per node naming all its subnets, and as many
// DescribeNetworkInterfaces per subnet (filtered by subnet-id, a bucket of
// its own of the same size) for the whole free /28s. A subnet
// shared by n nodes is still seen every 30/n minutes somewhere in the fleet,
// which is what the dashboards and alerts read (the lowest value across
// nodes).
const DefaultSubnetInterval = 30 * time.Minute

// awsReserved is how many addresses of every subnet AWS keeps for itself
// (network, VPC router, DNS, future use, broadcast).
const awsReserved = 5

// SubnetSource is what Subnets needs from the cloud: the node's ENIs from
// instance metadata (cheap, not rate-limited), one DescribeSubnets, and per
// subnet what its ENIs hold (DescribeNetworkInterfaces by subnet-id).
type SubnetSource interface {
	MetadataENIs(ctx context.Context) ([]provider.ENI, error)
	Subnets(ctx context.Context, q provider.SubnetQuery) ([]provider.Subnet, error)
	SubnetUsage(ctx context.Context, subnetID string) ([]netip.Prefix, error)
}

// Subnets keeps the free and usable address counts of the subnets holding
// the node's ENIs, and their whole free /28s, refreshed every interval
// (jittered ±50% so that nodes started together spread their calls), and
// exports them as vpcip_subnet_free_addresses, vpcip_subnet_usable_addresses
// and vpcip_subnet_free_prefixes, labelled subnet_id and availability_zone.
type Subnets struct {
	src      SubnetSource
	interval time.Duration
	log      *slog.Logger
	free     *prometheus.GaugeVec
	usable   *prometheus.GaugeVec
	prefixes *prometheus.GaugeVec

	mu     sync.Mutex        // guards the fields below
	latest []provider.Subnet // with FreePrefixes where read
	at     time.Time
}

// NewSubnets registers the subnet gauges on reg. interval 0 means
// DefaultSubnetInterval.
func NewSubnets(reg prometheus.Registerer, src SubnetSource, interval time.Duration, log *slog.Logger) *Subnets {
	if interval <= 0 {
		interval = DefaultSubnetInterval
	}
	labels := []string{"subnet_id", "availability_zone"}
	s := &Subnets{
		src: src, interval: interval, log: log,
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vpcip_subnet_free_addresses",
			Help: "Free addresses of a subnet holding this node's ENIs (EC2 AvailableIpAddressCount), refreshed at VPCIP_SUBNET_METRICS_INTERVAL.",
		}, labels),
		usable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vpcip_subnet_usable_addresses",
			Help: "Addresses of a subnet holding this node's ENIs that instances can use: its CIDR's size less the 5 AWS reserves.",
		}, labels),
		prefixes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vpcip_subnet_free_prefixes",
			Help: "Aligned /28s of a subnet holding this node's ENIs in which no address is held or reserved: the prefixes EC2 can still delegate before it answers InsufficientCidrBlocks (from DescribeNetworkInterfaces by subnet-id), refreshed at VPCIP_SUBNET_METRICS_INTERVAL.",
		}, labels),
	}
	reg.MustRegister(s.free, s.usable, s.prefixes)
	return s
}

// Run refreshes until ctx ends: first after a random delay of up to a
// minute (a fleet restarted at once does not call EC2 at once), then about
// every interval. A failed refresh keeps the last values and is logged; it
// is retried at the next tick. Run returns nil when ctx ends.
func (s *Subnets) Run(ctx context.Context) error {
	wait := time.Duration(rand.Int64N(int64(min(s.interval, time.Minute))))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		if err := s.Refresh(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("subnet metrics: refresh failed; keeping the last values", "err", err)
		}
		wait = s.interval/2 + time.Duration(rand.Int64N(int64(s.interval)))
	}
}

// Refresh reads the node's ENIs from instance metadata and their subnets
// from EC2 (one DescribeSubnets), and sets the gauges; subnets no ENI is in
// any more lose their series.
func (s *Subnets) Refresh(ctx context.Context) error {
	enis, err := s.src.MetadataENIs(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for _, e := range enis {
		if e.SubnetID != "" && !slices.Contains(ids, e.SubnetID) {
			ids = append(ids, e.SubnetID)
		}
	}
	if len(ids) == 0 { // no IDs would list the whole VPC
		return errors.New("instance metadata lists no ENI with a subnet")
	}
	subnets, err := s.src.Subnets(ctx, provider.SubnetQuery{IDs: ids})
	if err != nil {
		return err
	}
	whole := map[string]int{}
	for _, sn := range subnets {
		used, err := s.src.SubnetUsage(ctx, sn.ID)
		if err != nil {
			s.log.Warn("subnet metrics: reading the subnet's addresses failed; no free /28 count", "subnet", sn.ID, "err", err)
			continue
		}
		whole[sn.ID] = WholePrefixes(sn.CIDR, used)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free.Reset()
	s.usable.Reset()
	s.prefixes.Reset()
	for i, sn := range subnets {
		s.free.WithLabelValues(sn.ID, sn.AvailabilityZone).Set(float64(sn.FreeAddresses))
		s.usable.WithLabelValues(sn.ID, sn.AvailabilityZone).Set(float64(Usable(sn)))
		if w, ok := whole[sn.ID]; ok {
			s.prefixes.WithLabelValues(sn.ID, sn.AvailabilityZone).Set(float64(w))
			subnets[i].FreePrefixes = &w
		}
	}
	s.latest, s.at = subnets, time.Now()
	return nil
}

// WholePrefixes counts the aligned /28s of cidr in which no address of used
// (/32 addresses and /28 prefixes held by the subnet's ENIs) lies and none
// is one of the five AWS reserves (the first four and the last address):
// what EC2 AssignPrivateIpAddresses with Ipv4PrefixCount can still delegate.
// 0 for an invalid or non-IPv4 CIDR, or one smaller than a /28.
func WholePrefixes(cidr netip.Prefix, used []netip.Prefix) int {
	if !cidr.IsValid() || !cidr.Addr().Is4() || cidr.Bits() > 28 {
		return 0
	}
	cidr = cidr.Masked()
	broken := map[netip.Prefix]bool{netip.PrefixFrom(cidr.Addr(), 28): true} // network, router, DNS, reserved
	b := cidr.Addr().As4()
	v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) | (uint32(1)<<(32-cidr.Bits()) - 1)
	broken[netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 28).Masked()] = true // broadcast
	for _, p := range used {
		if p.Addr().Is4() && p.Bits() >= 28 && cidr.Contains(p.Addr()) {
			broken[netip.PrefixFrom(p.Addr(), 28).Masked()] = true
		}
	}
	return 1<<(28-cidr.Bits()) - len(broken)
}

// Latest returns the subnets of the last successful refresh and its time
// (zero before the first), with their whole free /28s (FreePrefixes, nil
// where reading the subnet's addresses failed), for other parts of the
// daemon that publish them (the node's AddressBudget) without calling EC2
// again.
func (s *Subnets) Latest() ([]provider.Subnet, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.latest), s.at
}

// Usable is how many of the subnet's addresses instances can use: the
// CIDR's size less the 5 AWS reserves in every subnet. 0 for an invalid
// CIDR.
func Usable(sn provider.Subnet) int {
	if !sn.CIDR.IsValid() || !sn.CIDR.Addr().Is4() {
		return 0
	}
	return max(1<<(32-sn.CIDR.Bits())-awsReserved, 0)
}
