package vpcsim_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// A VPC laid out for pods in other subnets: node subnets in the primary CIDR
// 100.64.0.0/16, pod subnets in the secondary CIDR 100.65.0.0/16, and a pod
// security group.
const (
	nodeA   = "subnet-00000000000000a01" // 100.64.0.0/24, us-west-2a
	podsA   = "subnet-00000000000000a02" // 100.65.0.0/20, us-west-2a, kubernetes.io/role/cni=1
	podsOff = "subnet-00000000000000a03" // 100.65.16.0/20, us-west-2a, kubernetes.io/role/cni=0
	podsB   = "subnet-00000000000000b02" // 100.65.32.0/20, us-west-2b, kubernetes.io/role/cni=1
	podSG   = "sg-000000000000000a1"
)

func podSubnetsConfig() vpcsim.Config {
	cni := func(v string) map[string]string { return map[string]string{"kubernetes.io/role/cni": v} }
	return vpcsim.Config{
		Seed:              11,
		SecondaryVPCCIDRs: []netip.Prefix{netip.MustParsePrefix("100.65.0.0/16")},
		Subnets: []vpcsim.SubnetSpec{
			{ID: nodeA, CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: "us-west-2a"},
			{ID: podsA, CIDR: netip.MustParsePrefix("100.65.0.0/20"), AvailabilityZone: "us-west-2a", Tags: cni("1")},
			{ID: podsOff, CIDR: netip.MustParsePrefix("100.65.16.0/20"), AvailabilityZone: "us-west-2a", Tags: cni("0")},
			{ID: podsB, CIDR: netip.MustParsePrefix("100.65.32.0/20"), AvailabilityZone: "us-west-2b", Tags: cni("1")},
		},
		SecurityGroups: []vpcsim.SecurityGroupSpec{{ID: podSG, Name: "pods", Description: "pod traffic", Tags: map[string]string{"team": "net"}}},
	}
}

// TestSubnetDiscoveryView checks what a daemon reads to choose a subnet:
// DescribeSubnets by VPC, zone and tag, with AvailableIpAddressCount that
// follows what is held, and DescribeSecurityGroups by name and id.
func TestSubnetDiscoveryView(t *testing.T) {
	l := vpcsimtest.Start(t, podSubnetsConfig())
	cli := ec2Client(l)
	f := func(name string, values ...string) types.Filter {
		return types.Filter{Name: aws.String(name), Values: values}
	}
	free := func(filters ...types.Filter) map[string]int32 {
		t.Helper()
		out, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{Filters: filters})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int32{}
		for _, s := range out.Subnets {
			m[aws.ToString(s.SubnetId)] = aws.ToInt32(s.AvailableIpAddressCount)
		}
		return m
	}
	inZone := []types.Filter{f("vpc-id", l.Cloud.VPCID()), f("availability-zone", "us-west-2a")}
	if diff := cmp.Diff(map[string]int32{nodeA: 256 - 5, podsA: 4096 - 5, podsOff: 4096 - 5}, free(inZone...)); diff != "" {
		t.Errorf("subnets of us-west-2a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int32{podsA: 4091, podsOff: 4091, podsB: 4091}, free(f("tag-key", "kubernetes.io/role/cni"))); diff != "" {
		t.Errorf("subnets with the cni tag (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int32{podsA: 4091, podsB: 4091}, free(f("tag:kubernetes.io/role/cni", "1"))); diff != "" {
		t.Errorf("subnets with cni=1 (-want +got):\n%s", diff)
	}
	held, err := l.Cloud.HoldAddresses(nodeA, 240)
	if err != nil || len(held) != 240 || held[0] != netip.MustParseAddr("100.64.0.4") {
		t.Fatalf("HoldAddresses: %d addresses from %v, %v", len(held), held[:min(1, len(held))], err)
	}
	if got := free(f("subnet-id", nodeA))[nodeA]; got != 11 {
		t.Errorf("node subnet after holding 240: %d free, want 11", got)
	}
	var ae *vpcsim.Error
	if _, err := l.Cloud.HoldAddresses(nodeA, 12); !errors.As(err, &ae) || ae.Code != "InsufficientFreeAddressesInSubnet" {
		t.Errorf("holding more than is free: %v", err)
	}
	if got := free(f("subnet-id", nodeA))[nodeA]; got != 11 {
		t.Errorf("a refused hold changed the free count to %d", got)
	}

	g, err := cli.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupNames: []string{"pods"}})
	if err != nil || len(g.SecurityGroups) != 1 || aws.ToString(g.SecurityGroups[0].GroupId) != podSG ||
		aws.ToString(g.SecurityGroups[0].Description) != "pod traffic" {
		t.Fatalf("group by name: %+v %v", g, err)
	}
	g, err = cli.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{f("tag:team", "net")}})
	if err != nil || len(g.SecurityGroups) != 1 {
		t.Fatalf("group by tag: %+v %v", g, err)
	}
	if got := len(l.Cloud.SecurityGroups()); got != 2 {
		t.Errorf("%d security groups, want default and pods", got)
	}
}

// TestENIInSecondaryCIDR creates an ENI in a pod subnet of the secondary
// CIDR with its own security group, as custom networking does, and checks
// EC2's and IMDS's view of it; an ENI of another zone cannot be attached.
func TestENIInSecondaryCIDR(t *testing.T) {
	l := vpcsimtest.Start(t, podSubnetsConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", nodeA)
	out, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
		SubnetId: aws.String(podsA), Groups: []string{podSG}, SecondaryPrivateIpAddressCount: aws.Int32(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	eni := aws.ToString(out.NetworkInterface.NetworkInterfaceId)
	if got := out.NetworkInterface.Groups; len(got) != 1 || aws.ToString(got[0].GroupId) != podSG || aws.ToString(got[0].GroupName) != "pods" {
		t.Errorf("created ENI's groups: %+v", got)
	}
	attach(t, cli, eni, inst.ID, 1)
	e := mustENI(t, l.Cloud, eni)
	pods := netip.MustParsePrefix("100.65.0.0/20")
	if !pods.Contains(e.PrimaryIP) || len(e.SecondaryIPs) != 3 || !pods.Contains(e.SecondaryIPs[2]) ||
		e.Gateway != netip.MustParseAddr("100.65.0.1") || !slices.Equal(e.SecurityGroups, []string{podSG}) {
		t.Fatalf("ENI in the pod subnet: %+v", e)
	}
	d, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{
		{Name: aws.String("group-id"), Values: []string{podSG}},
	}})
	if err != nil || len(d.NetworkInterfaces) != 1 || aws.ToString(d.NetworkInterfaces[0].NetworkInterfaceId) != eni {
		t.Fatalf("ENIs by group: %+v %v", d, err)
	}

	md := imdsClient(l, inst.ID)
	base := "network/interfaces/macs/" + e.MAC + "/"
	for path, want := range map[string]string{
		base + "subnet-id":              podsA,
		base + "subnet-ipv4-cidr-block": "100.65.0.0/20",
		base + "vpc-ipv4-cidr-block":    "100.64.0.0/16",
		base + "vpc-ipv4-cidr-blocks":   "100.64.0.0/16\n100.65.0.0/16",
		base + "security-group-ids":     podSG,
		base + "security-groups":        "pods",
		"network/interfaces/macs/" + inst.PrimaryENI.MAC + "/subnet-ipv4-cidr-block": "100.64.0.0/24",
	} {
		if got := imdsGet(t, md, path); got != want {
			t.Errorf("%s: got %q, want %q", path, got, want)
		}
	}
	if got := imdsGet(t, md, base+"local-ipv4s"); !strings.HasPrefix(got, e.PrimaryIP.String()+"\n") {
		t.Errorf("local-ipv4s %q", got)
	}

	other, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(podsB)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: other.NetworkInterface.NetworkInterfaceId,
		InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(2)})
	wantAPIError(t, err, "InvalidParameterValue", 400)
	_, err = cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(podsA), Groups: []string{"sg-0123456789abcdef0"}})
	wantAPIError(t, err, "InvalidGroup.NotFound", 400)
}

func TestBadSecurityGroupSpecs(t *testing.T) {
	for _, tt := range []struct {
		name string
		g    []vpcsim.SecurityGroupSpec
	}{
		{"no name", []vpcsim.SecurityGroupSpec{{ID: "sg-1"}}},
		{"default name", []vpcsim.SecurityGroupSpec{{Name: "default"}}},
		{"duplicate id", []vpcsim.SecurityGroupSpec{{ID: "sg-1", Name: "a"}, {ID: "sg-1", Name: "b"}}},
		{"not an sg id", []vpcsim.SecurityGroupSpec{{ID: "subnet-1", Name: "a"}}},
	} {
		if _, err := vpcsim.New(vpcsim.Config{SecurityGroups: tt.g}); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
}
