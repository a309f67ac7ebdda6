package vpcsim_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

func TestNewRejectsBadLayouts(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		name string
		cfg  vpcsim.Config
	}{
		{"subnet outside the VPC", vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{CIDR: p("10.0.0.0/24")}}}},
		{"overlapping subnets", vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{CIDR: p("100.64.0.0/24")}, {CIDR: p("100.64.0.128/25")}}}},
		{"unmasked subnet", vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{CIDR: p("100.64.0.7/24")}}}},
		{"subnet smaller than /28", vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{CIDR: p("100.64.0.0/29")}}}},
		{"IPv6 VPC", vpcsim.Config{VPCCIDR: p("fd00::/56")}},
		{"overlapping secondary CIDR", vpcsim.Config{SecondaryVPCCIDRs: []netip.Prefix{p("100.64.128.0/17")}}},
		{"duplicate subnet id", vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{ID: "subnet-1", CIDR: p("100.64.0.0/24")}, {ID: "subnet-1", CIDR: p("100.64.1.0/24")}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := vpcsim.New(tt.cfg); err == nil {
				t.Fatal("New accepted the layout")
			}
		})
	}
}

func TestDefaultsAndSecondaryCIDR(t *testing.T) {
	c, err := vpcsim.New(vpcsim.Config{
		SecondaryVPCCIDRs: []netip.Prefix{netip.MustParsePrefix("100.65.0.0/16")},
		Subnets: []vpcsim.SubnetSpec{
			{CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a"},
			{CIDR: netip.MustParsePrefix("100.65.0.0/20"), AvailabilityZone: "us-west-2a"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.VPCCIDRs(); len(got) != 2 || got[1] != netip.MustParsePrefix("100.65.0.0/16") {
		t.Fatalf("VPC CIDRs %v", got)
	}
	d, err := vpcsim.New(vpcsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"100.64.0.0/20 us-west-2a", "100.64.16.0/20 us-west-2b", "100.64.32.0/20 us-west-2c"}
	for i, s := range d.Subnets() {
		if got := s.CIDR.String() + " " + s.AvailabilityZone; got != want[i] || s.FreeAddresses != 4096-5 {
			t.Fatalf("default subnet %d: %s, %d free", i, got, s.FreeAddresses)
		}
	}
}

func TestLaunchInstance(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	inst := launchIn(t, l, "m5.large", subnetTiny)
	e := inst.PrimaryENI
	if e.DeviceIndex != 0 || e.Status != "in-use" || !e.DeleteOnTermination || e.PrimaryIP != netip.MustParseAddr("100.64.16.4") {
		t.Fatalf("primary ENI %+v (the first address after the four reserved)", e)
	}
	if id, ok := l.Cloud.InstanceByAddress(e.PrimaryIP); !ok || id != inst.ID {
		t.Fatalf("InstanceByAddress(%s) = %s, %v", e.PrimaryIP, id, ok)
	}
	if _, ok := l.Cloud.InstanceByAddress(netip.MustParseAddr("100.64.16.5")); ok {
		t.Fatal("InstanceByAddress found an unused address")
	}
	var ae *vpcsim.Error
	if _, err := l.Cloud.LaunchInstance("m5.nonesuch", ""); !errors.As(err, &ae) || ae.Code != "InvalidParameterValue" {
		t.Fatalf("unknown type: %v", err)
	}
	for range 26 {
		if _, err := l.Cloud.LaunchInstance("t3.nano", subnetTiny); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Cloud.LaunchInstance("t3.nano", subnetTiny); !errors.As(err, &ae) || ae.Code != "InsufficientFreeAddressesInSubnet" {
		t.Fatalf("launch into a full subnet: %v", err)
	}
	if err := l.Cloud.TerminateInstance(inst.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Cloud.InstanceByAddress(e.PrimaryIP); ok {
		t.Fatal("a terminated instance still answers for its address")
	}
	if err := l.Cloud.TerminateInstance("i-0123456789abcdef0"); !errors.As(err, &ae) || ae.Code != "InvalidInstanceID.NotFound" {
		t.Fatalf("terminate unknown: %v", err)
	}
}

func TestInstanceTypeTable(t *testing.T) {
	// Published figures (see ec2-instance-network-limits.csv's README).
	for name, want := range map[string][2]int{"m5.large": {3, 10}, "t3.small": {3, 4}, "t3.nano": {2, 2}, "c5.18xlarge": {15, 50}, "p3dn.24xlarge": {15, 50}} {
		it, ok := vpcsim.LookupInstanceType(name)
		if !ok || it.MaxENIs != want[0] || it.IPv4PerENI != want[1] {
			t.Errorf("%s: %+v", name, it)
		}
	}
	p5, _ := vpcsim.LookupInstanceType("p5.48xlarge")
	if p5.MaxNetworkCards != 32 || p5.CardENIs[0] != 2 || !p5.PrefixDelegation() {
		t.Errorf("p5.48xlarge: %+v", p5)
	}
	if m4, _ := vpcsim.LookupInstanceType("m4.large"); m4.PrefixDelegation() {
		t.Error("m4.large (Xen) allows prefixes")
	}
	if metal, _ := vpcsim.LookupInstanceType("c6in.metal"); !metal.PrefixDelegation() || !metal.BareMetal {
		t.Errorf("c6in.metal: %+v", metal)
	}
}

// TestAttachLimitPerNetworkCard attaches on a two-card bare-metal type: each
// card has its own ENI budget.
func TestAttachLimitPerNetworkCard(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "c6in.metal", subnetBig) // cards 0 and 1, 8 ENIs each
	for dev := int32(1); dev < 8; dev++ {
		attach(t, cli, createENI(t, cli, subnetBig), inst.ID, dev)
	}
	extra := createENI(t, cli, subnetBig)
	_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(extra), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(8)})
	wantAPIError(t, err, "AttachmentLimitExceeded", 400)
	out, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(extra), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1), NetworkCardIndex: aws.Int32(1)})
	if err != nil || aws.ToInt32(out.NetworkCardIndex) != 1 {
		t.Fatalf("attach on card 1: %v %v", out, err)
	}
	if e := mustENI(t, l.Cloud, extra); e.NetworkCard != 1 || e.DeviceIndex != 1 {
		t.Fatalf("ENI on card 1: %+v", e)
	}
	_, err = cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(createENI(t, cli, subnetBig)), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(2), NetworkCardIndex: aws.Int32(2)})
	wantAPIError(t, err, "InvalidParameterValue", 400)
}

// TestSeedMakesIDsDeterministic: two clouds with one seed and one sequence
// of changes name everything alike, whatever else was asked in between.
func TestSeedMakesIDsDeterministic(t *testing.T) {
	run := func(describes int) []string {
		l := vpcsimtest.Start(t, vpcsim.Config{Seed: 42})
		cli := ec2Client(l)
		inst := l.Launch(t, "m5.large")
		for range describes {
			if _, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{}); err != nil {
				t.Fatal(err)
			}
		}
		eni := createENI(t, cli, subnetOfInst(l, inst.ID))
		return []string{l.Cloud.VPCID(), inst.ID, inst.PrimaryENI.ID, inst.PrimaryENI.MAC, eni, mustENI(t, l.Cloud, eni).MAC}
	}
	a, b := run(0), run(3)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seeded ids differ: %v vs %v", a, b)
		}
	}
}

func subnetOfInst(l *vpcsimtest.Local, id string) string {
	inst, _ := l.Cloud.Instance(id)
	return inst.SubnetID
}
