package pool

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
	"github.com/vpcip/vpcip/warmpool"
)

const viewSubnet = "subnet-00000000000000a24"

// viewCloud is a /24 subnet whose EC2 picks addresses at random
// (ScatterAddresses, seeded), with another instance holding ten addresses
// of 100.64.0.16/28.
func viewCloud(t *testing.T) (*vpcsimtest.Local, *ec2.Client, vpcsim.InstanceInfo) {
	t.Helper()
	cloud := vpcsimtest.Start(t, vpcsim.Config{Seed: 24, ScatterAddresses: true, Subnets: []vpcsim.SubnetSpec{
		{ID: viewSubnet, CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: "us-west-2a"},
	}})
	cli := ec2.New(ec2.Options{Region: "us-west-2", BaseEndpoint: aws.String(cloud.EC2URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDVIEWTEST", "secret", ""), RetryMaxAttempts: 1})
	other, err := cloud.Cloud.LaunchInstance("c5.18xlarge", viewSubnet)
	if err != nil {
		t.Fatal(err)
	}
	var ten []string
	for i := 20; i < 30; i++ {
		ten = append(ten, netip.AddrFrom4([4]byte{100, 64, 0, byte(i)}).String())
	}
	if _, err := cli.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: ten}); err != nil {
		t.Fatal(err)
	}
	return cloud, cli, other
}

func wholeBlocks(t *testing.T, cloud *vpcsimtest.Local) int {
	t.Helper()
	s, ok := cloud.Cloud.Subnet(viewSubnet)
	if !ok {
		t.Fatal("subnet gone")
	}
	return s.FreePrefixes
}

// TestAssignNamesAddressesInBrokenBlocks: a node warming up with single
// addresses names them from /28s that are already broken (EC2
// AssignPrivateIpAddresses with PrivateIpAddresses), so the subnet keeps all
// its whole /28s; letting EC2 choose at random breaks some.
func TestAssignNamesAddressesInBrokenBlocks(t *testing.T) {
	cloud, _, _ := viewCloud(t)
	clock := &virtualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	before := wholeBlocks(t, cloud)
	n := launchNode(t, cloud, clock, "m5.xlarge", viewSubnet, Options{Config: warmpool.Config{WarmIPTarget: 8}})
	if got := wholeBlocks(t, cloud); got != before && got != before-1 {
		t.Fatalf("launch: %d whole /28s, had %d", got, before) // the node's primary may break one
	}
	// No subnet read in the first half view interval after the start
	// (B08): the first growth after it names addresses.
	clock.Advance(3 * DefaultSubnetView / 2)
	before = wholeBlocks(t, cloud)
	n.pool.Cycle(context.Background())
	singles, _ := n.holdings()
	if singles < 8 {
		t.Fatalf("node holds %d single addresses, want ≥ 8", singles)
	}
	if got := wholeBlocks(t, cloud); got != before {
		t.Errorf("whole /28s %d → %d: the node's single addresses broke whole /28s", before, got)
	}
	if got := cloud.Cloud.Faults().Calls("DescribeNetworkInterfaces"); got == 0 {
		t.Errorf("no DescribeNetworkInterfaces: the subnet view was never read")
	}
}

// TestNamedAssignFallsBack: when the view is stale and EC2 refuses the
// named addresses (another ENI took them: InvalidParameterValue), the pool
// asks for the same count with EC2 choosing, in the same cycle, and does
// not read the subnet again before Options.SubnetView has passed.
func TestNamedAssignFallsBack(t *testing.T) {
	cloud, cli, other := viewCloud(t)
	clock := &virtualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	n := launchNode(t, cloud, clock, "m5.xlarge", viewSubnet, Options{Config: warmpool.Config{WarmIPTarget: 3}})
	ctx := context.Background()
	clock.Advance(3 * DefaultSubnetView / 2) // past the start's quiet time (B08)
	n.pool.Cycle(ctx)                        // reads the view, names 3
	describes := cloud.Cloud.Faults().Calls("DescribeNetworkInterfaces")
	// Out of band, other instances take every free address of every
	// broken /28: whatever the node names next from its view is taken.
	third, err := cloud.Cloud.LaunchInstance("c5.18xlarge", viewSubnet)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := cloud.Cloud.Subnet(viewSubnet)
	taken := map[netip.Addr]bool{}
	for _, ni := range cloud.Cloud.NetworkInterfaces() {
		taken[ni.PrimaryIP] = true
		for _, a := range ni.SecondaryIPs {
			taken[a] = true
		}
	}
	var fill []string
	for b := s.CIDR.Addr(); s.CIDR.Contains(b); {
		blk := netip.PrefixFrom(b, 28)
		broken := reservedIn(s.CIDR, b) || blk.Contains(lastOf(s.CIDR))
		for a := b; blk.Contains(a); a = a.Next() {
			broken = broken || taken[a]
		}
		for a := b; blk.Contains(a); a = a.Next() {
			if broken && !taken[a] && !reservedIn(s.CIDR, a) {
				fill = append(fill, a.String())
			}
		}
		for range 16 {
			b = b.Next()
		}
	}
	if len(fill) == 0 || len(fill) > 39+49 {
		t.Fatalf("setup: %d free addresses in broken /28s, want 1..88 (the other ENIs' room)", len(fill))
	}
	for i, eni := range []string{other.PrimaryENI.ID, third.PrimaryENI.ID} {
		part := fill[min(i*39, len(fill)):min(39+i*49, len(fill))]
		if len(part) == 0 {
			continue
		}
		if _, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: part}); err != nil {
			t.Fatal(err)
		}
	}
	assigns := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses")
	for range 3 {
		if !n.start(clock.Now()) {
			t.Fatal("no free address for a pod")
		}
	}
	clock.Advance(time.Minute)
	n.pool.Cycle(ctx)
	if n.pool.namedRefused != 1 {
		t.Errorf("named assignments refused: %d, want 1", n.pool.namedRefused)
	}
	if got := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses") - assigns; got != 2 {
		t.Errorf("AssignPrivateIpAddresses calls in the cycle: %d, want 2 (named, refused; then EC2 choosing)", got)
	}
	if sum := warmpool.Summarize(n.pool.Input(clock.Now())); sum.Available < 3 {
		t.Errorf("after the fallback %d free, want ≥ 3", sum.Available)
	}
	if got := cloud.Cloud.Faults().Calls("DescribeNetworkInterfaces"); got != describes {
		t.Errorf("the subnet was read again within Options.SubnetView (%d → %d describes)", describes, got)
	}
	// Naming pauses for a tenth of Options.SubnetView after the refusal:
	// growth within it lets EC2 choose, without reading the subnet.
	for range 3 {
		n.start(clock.Now())
	}
	clock.Advance(DefaultSubnetView/10 - 2*time.Second)
	assigns = cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses")
	n.pool.Cycle(ctx)
	if got := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses") - assigns; got != 1 || n.pool.namedRefused != 1 {
		t.Errorf("growth during the pause: %d calls, %d refused in all; want 1 call, no new refusal", got, n.pool.namedRefused)
	}
	if got := cloud.Cloud.Faults().Calls("DescribeNetworkInterfaces"); got != describes {
		t.Errorf("the subnet was read during the pause (%d → %d describes)", describes, got)
	}
	// After the pause the subnet is read again before naming.
	clock.Advance(DefaultSubnetView / 10)
	for range 3 {
		n.start(clock.Now())
	}
	n.pool.Cycle(ctx)
	if got := cloud.Cloud.Faults().Calls("DescribeNetworkInterfaces"); got != describes+1 {
		t.Errorf("after the pause: %d describes, want %d (one read)", got, describes+1)
	}
}
