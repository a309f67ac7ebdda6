package pool

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
	"github.com/vpcip/vpcip/warmpool"
)

// TestFallbackTurnsBackIntoAPrefix runs a prefix-mode node (vpcip's default
// adaptive policy) on vpcsim through the AWS SDK. Its subnet,
// 100.64.16.64/26, can hold two whole /28s (.80 and .96); another
// instance holds one address in each, so EC2 refuses the node's /28
// (InsufficientCidrBlocks) and the node falls back to single addresses for
// its pods. Then the other instance gives back its address in .96/28: the
// node gets that /28 within the refusal's backoff, gives back its free
// single addresses (never one a pod holds), and its next pod gets an
// address of the /28. Before the conversion the node kept its single
// addresses and asked for no /28: they covered its demand.
func TestFallbackTurnsBackIntoAPrefix(t *testing.T) {
	cloud, clock, n, cli, other := fragmentedNode(t, "subnet-00000000000f28c0", 0)
	ctx := context.Background()
	podAddrs := map[string]netip.Addr{}
	for _, pod := range n.pods {
		a, ok := n.store.Get(podKey(pod))
		if !ok {
			t.Fatalf("pod %s has no address", pod)
		}
		podAddrs[pod] = a.Address
	}

	// .96/28 is whole again.
	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.16.100"}}); err != nil {
		t.Fatal(err)
	}
	assigns := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses")
	for range 60 { // 10 simulated minutes: beyond the refusal's longest backoff (5 min)
		n.pool.Cycle(ctx)
		clock.Advance(10 * time.Second)
	}
	var eni vpcsim.ENIInfo // what EC2 shows of the node's ENIs, together
	for _, e := range cloud.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.id {
			eni.Prefixes = append(eni.Prefixes, e.Prefixes...)
			eni.SecondaryIPs = append(eni.SecondaryIPs, e.SecondaryIPs...)
		}
	}
	want := netip.MustParsePrefix("100.64.16.96/28")
	if !slices.Contains(eni.Prefixes, want) {
		t.Fatalf("EC2 shows the node's ENI with prefixes %v and addresses %v; want %v", eni.Prefixes, eni.SecondaryIPs, want)
	}
	for pod, a := range podAddrs {
		if !slices.Contains(eni.SecondaryIPs, a) {
			t.Errorf("pod %s's address %s was released", pod, a)
		}
		if got, ok := n.store.Get(podKey(pod)); !ok || got.Address != a {
			t.Errorf("pod %s now holds %v (%v), want %s", pod, got.Address, ok, a)
		}
	}
	if len(eni.SecondaryIPs) != len(podAddrs) {
		t.Errorf("EC2 shows single addresses %v; want only the pods' %v", eni.SecondaryIPs, podAddrs)
	}
	if calls := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses") - assigns; calls > 3 {
		t.Errorf("%d AssignPrivateIpAddresses calls for the conversion, want at most 3", calls)
	}
	if !n.start(clock.Now()) {
		t.Fatal("a new pod found no address")
	}
	if a, _ := n.store.Get(podKey(n.pods[len(n.pods)-1])); !want.Contains(a.Address) {
		t.Errorf("the new pod got %s, want an address of %s", a.Address, want)
	}
}

// besideOther starts vpcsim with subnet 100.64.16.64/26, whose only /28s
// without an address EC2 reserves are .80 and .96, launches a prefix-mode
// node there (vpcip's default adaptive policy, real EC2 provider through
// the AWS SDK) and another instance that holds the addresses holds, named
// through its own EC2 client, which it returns.
func besideOther(t *testing.T, subnet string, holds ...string) (*vpcsimtest.Local, *virtualClock, *simNode, *ec2.Client, vpcsim.InstanceInfo) {
	t.Helper()
	cloud := vpcsimtest.Start(t, vpcsim.Config{Seed: 5, Subnets: []vpcsim.SubnetSpec{
		{ID: subnet, CIDR: netip.MustParsePrefix("100.64.16.64/26"), AvailabilityZone: "us-west-2a"},
	}})
	clock := &virtualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	n := launchNode(t, cloud, clock, "m5.large", subnet, Options{Config: warmpool.Config{PrefixDelegation: true, Adaptive: true}})
	other, err := cloud.Cloud.LaunchInstance("m5.large", subnet)
	if err != nil {
		t.Fatal(err)
	}
	cli := ec2.NewFromConfig(sdkConfig(t, cloud, other.ID))
	if _, err := cli.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: holds}); err != nil {
		t.Fatal(err)
	}
	return cloud, clock, n, cli, other
}

// startPods starts pods on n until it runs want of them, trying those
// still without an address again after each pool cycle, one simulated
// second apart, for at most cycles cycles.
func startPods(ctx context.Context, clock *virtualClock, n *simNode, want, cycles int) {
	for i := 0; i < cycles && len(n.pods) < want; i++ {
		n.waiting = 0
		for range want - len(n.pods) {
			n.start(clock.Now())
		}
		n.pool.Cycle(ctx)
		clock.Advance(time.Second)
	}
}

// fragmentedNode starts vpcsim with subnet 100.64.16.64/26, whose only
// /28s without an address EC2 reserves are .80 and .96, launches a
// prefix-mode node there (vpcip's default adaptive policy, real EC2
// provider through the AWS SDK) and another instance that holds one
// address in each of those /28s, advances the clock by wait, and starts
// three pods: EC2 refuses the node's /28 (InsufficientCidrBlocks) and the
// node falls back to single addresses. It returns the other instance's
// EC2 client, for giving an address back.
func fragmentedNode(t *testing.T, subnet string, wait time.Duration) (*vpcsimtest.Local, *virtualClock, *simNode, *ec2.Client, vpcsim.InstanceInfo) {
	t.Helper()
	cloud, clock, n, cli, other := besideOther(t, subnet, "100.64.16.85", "100.64.16.100")
	ctx := context.Background()
	if s, _ := cloud.Cloud.Subnet(subnet); s.FreePrefixes != 0 {
		t.Fatalf("setup: %d whole /28s, want 0", s.FreePrefixes)
	}
	clock.Advance(wait)
	startPods(ctx, clock, n, 3, 20)
	if singles, prefixes := n.holdings(); len(n.pods) != 3 || prefixes != 0 || singles < 3 {
		t.Fatalf("fallback: %d pods, %d single addresses, %d /28s; want 3 pods on single addresses", len(n.pods), singles, prefixes)
	}
	return cloud, clock, n, cli, other
}

// prefixesAfter runs the node's pool cycles times, 10 simulated seconds
// apart, and returns the /28 prefixes EC2 then shows on its ENIs.
func prefixesAfter(cloud *vpcsimtest.Local, clock *virtualClock, n *simNode, cycles int) []netip.Prefix {
	for range cycles {
		n.pool.Cycle(context.Background())
		clock.Advance(10 * time.Second)
	}
	var got []netip.Prefix
	for _, e := range cloud.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.id {
			got = append(got, e.Prefixes...)
		}
	}
	return got
}

// TestNoPrefixRequestWhileTheViewShowsNoWholeBlock: after EC2 refused a
// /28 (InsufficientCidrBlocks), a node whose subnet view shows no whole
// aligned /28 does not ask again at each backoff (each ask would be one
// more refused mutating call); once another instance gives back what
// broke a /28, the node asks within a view interval and a backoff, and
// gets it.
func TestNoPrefixRequestWhileTheViewShowsNoWholeBlock(t *testing.T) {
	// Past the start's spread, so the pool reads its view when it needs it.
	cloud, clock, n, cli, other := fragmentedNode(t, "subnet-00000000000f28c1", 3*DefaultSubnetView/2)
	ctx := context.Background()
	refused := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses")
	for range 60 { // 10 simulated minutes: beyond the refusal's longest backoff (5 min)
		n.pool.Cycle(ctx)
		clock.Advance(10 * time.Second)
	}
	if calls := cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses") - refused; calls != 0 {
		t.Errorf("%d AssignPrivateIpAddresses calls in 10 minutes with no whole /28 in the subnet; want none", calls)
	}
	if n.pool.prefix.held == 0 {
		t.Errorf("no /28 request held back; the plan should have asked for one after each backoff")
	}
	// .96/28 is whole again.
	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.16.100"}}); err != nil {
		t.Fatal(err)
	}
	want := netip.MustParsePrefix("100.64.16.96/28")
	if got := prefixesAfter(cloud, clock, n, 6*16); !slices.Contains(got, want) { // a view interval and the longest backoff
		t.Fatalf("the node's prefixes %v after the /28 came back; want %v", got, want)
	}
}

// TestPrefixHoldLiftsWhenTheViewCannotBeRead: a node holding its /28
// requests back on the subnet view sends them again once the view has not
// been read successfully for half a view interval (DescribeNetworkInterfaces
// refused: a lost permission, or throttled): with the last view kept, the
// hold stood for good, though EC2 had a whole /28 again (found by review).
func TestPrefixHoldLiftsWhenTheViewCannotBeRead(t *testing.T) {
	cloud, clock, n, cli, other := fragmentedNode(t, "subnet-00000000000f28c2", 3*DefaultSubnetView/2)
	ctx := context.Background()
	for range 60 {
		n.pool.Cycle(ctx)
		clock.Advance(10 * time.Second)
	}
	if n.pool.prefix.held == 0 {
		t.Fatalf("setup: no /28 request held back")
	}
	cloud.Cloud.Faults().SetErrorRate("DescribeNetworkInterfaces", 1, "UnauthorizedOperation")
	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.16.100"}}); err != nil {
		t.Fatal(err)
	}
	want := netip.MustParsePrefix("100.64.16.96/28")
	if got := prefixesAfter(cloud, clock, n, 6*15); !slices.Contains(got, want) { // half a view interval and the longest backoff
		t.Fatalf("with the subnet view unreadable and %v whole again, the node's prefixes are %v", want, got)
	}
}

// TestFreeBlocks counts the aligned /28s of a subnet that hold no address
// in use and none of EC2's five reserved ones (the first four and the last
// address of the subnet), for subnets of /16 to /29, one whose base is not
// aligned, and at both ends of the address space.
func TestFreeBlocks(t *testing.T) {
	for _, c := range []struct {
		cidr string
		want int
	}{
		{"10.0.0.0/16", 4094}, {"10.0.0.0/24", 14}, {"10.0.0.64/26", 2}, {"10.0.0.64/27", 0},
		{"10.0.0.16/28", 0}, {"10.0.0.8/29", 0}, {"10.0.0.77/26", 2}, {"255.255.255.0/24", 14}, {"0.0.0.0/24", 14},
	} {
		if got := freeBlocks(netip.MustParsePrefix(c.cidr), nil); got != c.want {
			t.Errorf("%s: %d whole /28s, want %d", c.cidr, got, c.want)
		}
	}
	used := map[netip.Prefix]bool{netip.MustParsePrefix("10.0.0.80/28"): true}
	if got := freeBlocks(netip.MustParsePrefix("10.0.0.64/26"), used); got != 1 {
		t.Errorf("10.0.0.64/26 with .80/28 in use: %d whole /28s, want 1", got)
	}
}

// TestRefusedPrefixesAreAskedForByHalves: subnet 100.64.16.64/26 holds two
// /28s without an address EC2 reserves (.80 and .96); another instance
// holds an address in .96, so one whole /28 is left. Twenty pods come at
// once to a prefix-mode node (vpcip's default adaptive policy, real EC2
// provider through the AWS SDK): it asks for two /28s, and EC2 refuses the
// whole request (InsufficientCidrBlocks). The node then asks for one and
// gets .80/28, rather than falling back to single addresses for all its
// pods; only the rest of its pods get single addresses.
func TestRefusedPrefixesAreAskedForByHalves(t *testing.T) {
	const subnet = "subnet-00000000000f28c1"
	cloud, clock, n, _, _ := besideOther(t, subnet, "100.64.16.100")
	ctx := context.Background()
	if s, _ := cloud.Cloud.Subnet(subnet); s.FreePrefixes != 1 {
		t.Fatalf("setup: %d whole /28s, want 1", s.FreePrefixes)
	}
	startPods(ctx, clock, n, 20, 30)
	var prefixes []netip.Prefix
	for _, e := range cloud.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.id {
			prefixes = append(prefixes, e.Prefixes...)
		}
	}
	if want := netip.MustParsePrefix("100.64.16.80/28"); !slices.Contains(prefixes, want) {
		singles, _ := n.holdings()
		t.Errorf("EC2 shows the node with prefixes %v and %d single addresses; want %v", prefixes, singles, want)
	}
	if len(n.pods) != 20 {
		t.Errorf("%d of 20 pods got an address", len(n.pods))
	}
}
