package pool

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
	"github.com/vpcip/vpcip/warmpool"
)

// TestFillingRoomENINotRefusedOverAndOver: a filling secondary-IP node
// (m5.xlarge, first pod 5 min ago, two ENIs holding 28 addresses, 23 pods)
// in a subnet with 5 free addresses. Its room ENI asks for all 14
// addresses and EC2 refuses (InsufficientFreeAddressesInSubnet); the
// refusal halves the next request, as for growth, so one pool cycle sends
// a few CreateNetworkInterface calls, not the same refused one over and
// over (found by review: 16 in one cycle).
func TestFillingRoomENINotRefusedOverAndOver(t *testing.T) {
	const subnet = "subnet-00000000000f28c4"
	cloud := vpcsimtest.Start(t, vpcsim.Config{Seed: 5, Subnets: []vpcsim.SubnetSpec{
		{ID: subnet, CIDR: netip.MustParsePrefix("100.64.16.0/26"), AvailabilityZone: "us-west-2a"},
	}})
	clock := &virtualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	n := launchNode(t, cloud, clock, "m5.xlarge", subnet, Options{Config: warmpool.Config{Adaptive: true}, SubnetView: -1})
	ctx := context.Background()
	node := ec2.NewFromConfig(sdkConfig(t, cloud, n.id))
	inst, _ := cloud.Cloud.Instance(n.id)
	if _, err := node.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), SecondaryPrivateIpAddressCount: aws.Int32(14)}); err != nil {
		t.Fatal(err)
	}
	ni, err := node.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnet), SecondaryPrivateIpAddressCount: aws.Int32(14)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: ni.NetworkInterface.NetworkInterfaceId,
		InstanceId: aws.String(n.id), DeviceIndex: aws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	enis, err := n.pool.o.Provider.ENIs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.store.Cloud().Sync(enis, clock.Now())
	// Six pods from before (a DaemonSet's; no arrival recorded), the node's
	// first pod, then one every 15 s for 4 minutes: 23 pods.
	for i := range 6 {
		pod := "ds-" + string(rune('a'+i))
		if _, _, err := n.store.Assign(podKey(pod), api.Pod{Namespace: "kube-system", Name: pod}, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	n.start(clock.Now())
	clock.Advance(time.Minute)
	for range 16 {
		n.start(clock.Now())
		clock.Advance(15 * time.Second)
	}
	// Another instance leaves the subnet 5 free addresses.
	other, err := cloud.Cloud.LaunchInstance("m5.4xlarge", subnet)
	if err != nil {
		t.Fatal(err)
	}
	si, _ := cloud.Cloud.Subnet(subnet)
	cli := ec2.NewFromConfig(sdkConfig(t, cloud, other.ID))
	if _, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(other.PrimaryENI.ID), SecondaryPrivateIpAddressCount: aws.Int32(int32(si.FreeAddresses - 5))}); err != nil {
		t.Fatal(err)
	}
	si, _ = cloud.Cloud.Subnet(subnet)
	t.Logf("subnet: %d free; node: %d ENIs, %d pods", si.FreeAddresses, len(n.store.ENIs()), len(n.pods)+6)
	created := cloud.Cloud.Faults().Calls("CreateNetworkInterface")
	n.pool.Cycle(ctx)
	calls := cloud.Cloud.Faults().Calls("CreateNetworkInterface") - created
	t.Logf("refusals after the cycle: %v", n.pool.Refusals(clock.Now()))
	if calls > 4 {
		t.Errorf("%d CreateNetworkInterface calls in one pool cycle; want at most 4 (14, 7, 3, 1 addresses: each refusal halves the next)", calls)
	}
	if len(n.store.ENIs()) != 3 {
		t.Errorf("%d ENIs after the cycle; want the room ENI made with what the subnet has", len(n.store.ENIs()))
	}
}
