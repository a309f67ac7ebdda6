package vpcsim_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

const subnetNoV6 = "subnet-0000000000000000e" // 100.64.48.0/20, us-west-2a, no IPv6 CIDR

func ipv6Config(seed int64) vpcsim.Config {
	return vpcsim.Config{Seed: seed, Subnets: []vpcsim.SubnetSpec{
		{ID: subnetBig, CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a"},
		{ID: subnetB, CIDR: netip.MustParsePrefix("100.64.32.0/20"), AvailabilityZone: "us-west-2b"},
		{ID: subnetNoV6, CIDR: netip.MustParsePrefix("100.64.48.0/20"), AvailabilityZone: "us-west-2a", NoIPv6: true},
	}}
}

// TestSubnetIPv6CIDRsThroughSDK: the VPC has a /56 of Amazon's pool chosen
// by the seed, each subnet a different /64 of it unless made without one,
// as DescribeSubnets shows.
func TestSubnetIPv6CIDRsThroughSDK(t *testing.T) {
	l := vpcsimtest.Start(t, ipv6Config(3))
	vpc6 := l.Cloud.VPCIPv6CIDR()
	if vpc6.Bits() != 56 || !netip.MustParsePrefix("2600:1f14::/32").Contains(vpc6.Addr()) {
		t.Fatalf("VPC IPv6 CIDR %s: want a /56 inside 2600:1f14::/32", vpc6)
	}
	again, err := vpcsim.New(ipv6Config(3))
	if err != nil {
		t.Fatal(err)
	}
	other, err := vpcsim.New(ipv6Config(4))
	if err != nil {
		t.Fatal(err)
	}
	if again.VPCIPv6CIDR() != vpc6 || other.VPCIPv6CIDR() == vpc6 {
		t.Fatalf("VPC /56 by seed: seed 3 %s and %s, seed 4 %s; want the same for the same seed only", vpc6, again.VPCIPv6CIDR(), other.VPCIPv6CIDR())
	}

	out, err := ec2Client(l).DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range out.Subnets {
		id := aws.ToString(s.SubnetId)
		if id == subnetNoV6 {
			if len(s.Ipv6CidrBlockAssociationSet) != 0 {
				t.Fatalf("%s made without IPv6 shows %+v", id, s.Ipv6CidrBlockAssociationSet)
			}
			continue
		}
		if len(s.Ipv6CidrBlockAssociationSet) != 1 {
			t.Fatalf("%s: %d IPv6 CIDR associations, want 1", id, len(s.Ipv6CidrBlockAssociationSet))
		}
		a := s.Ipv6CidrBlockAssociationSet[0]
		p := netip.MustParsePrefix(aws.ToString(a.Ipv6CidrBlock))
		if p.Bits() != 64 || !vpc6.Contains(p.Addr()) || seen[p.String()] || a.Ipv6CidrBlockState == nil || a.Ipv6CidrBlockState.State != types.SubnetCidrBlockStateCodeAssociated || aws.ToString(a.AssociationId) == "" {
			t.Fatalf("%s: IPv6 association %s (%+v): want a distinct associated /64 of %s", id, p, a, vpc6)
		}
		seen[p.String()] = true
		if mustSubnet(t, l.Cloud, id).IPv6CIDR != p {
			t.Fatalf("%s: SDK shows %s, model %s", id, p, mustSubnet(t, l.Cloud, id).IPv6CIDR)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("%d subnets with IPv6, want 2", len(seen))
	}

	if _, err := vpcsim.New(vpcsim.Config{NoIPv6: true}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []vpcsim.Config{
		{VPCIPv6CIDR: netip.MustParsePrefix("2600:1f14:1::/48")},
		{VPCIPv6CIDR: netip.MustParsePrefix("2600:1f14:1:200::/56"), Subnets: []vpcsim.SubnetSpec{{CIDR: netip.MustParsePrefix("100.64.0.0/20"), IPv6CIDR: netip.MustParsePrefix("2600:1f14:2::/64")}}},
		{VPCIPv6CIDR: netip.MustParsePrefix("2600:1f14:1:200::/56"), Subnets: []vpcsim.SubnetSpec{{CIDR: netip.MustParsePrefix("100.64.0.0/20"), IPv6CIDR: netip.MustParsePrefix("2600:1f14:1:201::/80")}}},
	} {
		if _, err := vpcsim.New(bad); err == nil {
			t.Fatalf("vpcsim.New accepted a bad IPv6 layout: %+v", bad)
		}
	}
}

// TestIPv6AssignThroughSDK assigns a /80 prefix, a count of addresses and a
// named address to an ENI with aws-sdk-go-v2, checks DescribeNetworkInterfaces
// and the model show them, unassigns them and checks they are gone and free.
func TestIPv6AssignThroughSDK(t *testing.T) {
	l := vpcsimtest.Start(t, ipv6Config(5))
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eniID := inst.PrimaryENI.ID
	sub6 := mustSubnet(t, l.Cloud, subnetBig).IPv6CIDR

	pfx, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(eniID), Ipv6PrefixCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(pfx.NetworkInterfaceId) != eniID || len(pfx.AssignedIpv6Prefixes) != 1 || len(pfx.AssignedIpv6Addresses) != 0 {
		t.Fatalf("AssignIpv6Addresses(Ipv6PrefixCount=1) answered %+v", pfx)
	}
	p80 := netip.MustParsePrefix(pfx.AssignedIpv6Prefixes[0])
	if p80.Bits() != 80 || p80.Masked() != p80 || !sub6.Contains(p80.Addr()) {
		t.Fatalf("assigned prefix %s: want an aligned /80 of %s", p80, sub6)
	}

	cnt, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(eniID), Ipv6AddressCount: aws.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	named := sub6.Addr().Next().Next().Next().Next().Next() // ::5, past the four reserved
	one, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(eniID), Ipv6Addresses: []string{named.String()}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(one.AssignedIpv6Addresses, []string{named.String()}) {
		t.Fatalf("named assignment answered %v, want [%s]", one.AssignedIpv6Addresses, named)
	}
	want := append(slices.Clone(cnt.AssignedIpv6Addresses), named.String())
	if len(want) != 3 || want[0] == want[1] {
		t.Fatalf("count assignment answered %v, want 2 distinct addresses", cnt.AssignedIpv6Addresses)
	}
	for _, s := range want {
		a := netip.MustParseAddr(s)
		if !sub6.Contains(a) || p80.Contains(a) {
			t.Fatalf("assigned address %s: want one of %s outside the ENI's %s", a, sub6, p80)
		}
	}

	describe := func() types.NetworkInterface {
		t.Helper()
		out, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eniID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.NetworkInterfaces) != 1 {
			t.Fatalf("describe %s: %d ENIs", eniID, len(out.NetworkInterfaces))
		}
		return out.NetworkInterfaces[0]
	}
	ni := describe()
	var gotAddrs, gotPfx []string
	for _, a := range ni.Ipv6Addresses {
		gotAddrs = append(gotAddrs, aws.ToString(a.Ipv6Address))
	}
	for _, p := range ni.Ipv6Prefixes {
		gotPfx = append(gotPfx, aws.ToString(p.Ipv6Prefix))
	}
	if !slices.Equal(gotAddrs, want) || !slices.Equal(gotPfx, []string{p80.String()}) {
		t.Fatalf("DescribeNetworkInterfaces shows addresses %v prefixes %v; want %v and [%s]", gotAddrs, gotPfx, want, p80)
	}
	e := mustENI(t, l.Cloud, eniID)
	if !slices.Equal(e.IPv6Addresses, addrs(want)) || !slices.Equal(e.IPv6Prefixes, []netip.Prefix{p80}) {
		t.Fatalf("model ENI IPv6 %v %v, want %v [%s]", e.IPv6Addresses, e.IPv6Prefixes, want, p80)
	}
	filtered, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{{Name: aws.String("ipv6-addresses.ipv6-address"), Values: []string{named.String()}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(filtered.NetworkInterfaces) != 1 || aws.ToString(filtered.NetworkInterfaces[0].NetworkInterfaceId) != eniID {
		t.Fatalf("filter ipv6-addresses.ipv6-address=%s found %d ENIs", named, len(filtered.NetworkInterfaces))
	}

	un, err := cli.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(eniID), Ipv6Addresses: want, Ipv6Prefixes: []string{p80.String()}})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(un.NetworkInterfaceId) != eniID || !slices.Equal(un.UnassignedIpv6Addresses, want) || !slices.Equal(un.UnassignedIpv6Prefixes, []string{p80.String()}) {
		t.Fatalf("UnassignIpv6Addresses answered %+v", un)
	}
	if ni := describe(); len(ni.Ipv6Addresses) != 0 || len(ni.Ipv6Prefixes) != 0 {
		t.Fatalf("after unassign DescribeNetworkInterfaces still shows %+v %+v", ni.Ipv6Addresses, ni.Ipv6Prefixes)
	}
	if e := mustENI(t, l.Cloud, eniID); len(e.IPv6Addresses)+len(e.IPv6Prefixes) != 0 {
		t.Fatalf("after unassign the model still holds %v %v", e.IPv6Addresses, e.IPv6Prefixes)
	}

	// Freed: another ENI can take the same /80 and address by name.
	other := launchIn(t, l, "m5.large", subnetBig)
	if _, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(other.PrimaryENI.ID), Ipv6Prefixes: []string{p80.String()}}); err != nil {
		t.Fatalf("freed /80 %s not assignable again: %v", p80, err)
	}
	if _, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(other.PrimaryENI.ID), Ipv6Addresses: []string{named.String()}}); err != nil {
		t.Fatalf("freed address %s not assignable again: %v", named, err)
	}
}

// TestIPv6FreedWithTheENI: deleting an ENI (or terminating its instance)
// frees its IPv6 addresses and prefixes.
func TestIPv6FreedWithTheENI(t *testing.T) {
	l := vpcsimtest.Start(t, ipv6Config(6))
	cli := ec2Client(l)
	eni := createENI(t, cli, subnetBig)
	b := mustSubnet(t, l.Cloud, subnetBig).IPv6CIDR.Addr().As16()
	b[9] = 7 // the subnet's /80 number 7
	p80 := netip.PrefixFrom(netip.AddrFrom16(b), 80)
	assign6 := func(id string) error {
		_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(id), Ipv6Prefixes: []string{p80.String()}})
		return err
	}
	if err := assign6(eni); err != nil {
		t.Fatal(err)
	}
	inst := launchIn(t, l, "m5.large", subnetBig)
	wantAPIError(t, assign6(inst.PrimaryENI.ID), "InvalidParameterValue", 400)
	if _, err := cli.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni)}); err != nil {
		t.Fatal(err)
	}
	if err := assign6(inst.PrimaryENI.ID); err != nil {
		t.Fatalf("after DeleteNetworkInterface the /80 is still held: %v", err)
	}
	if err := l.Cloud.TerminateInstance(inst.ID); err != nil {
		t.Fatal(err)
	}
	if err := assign6(createENI(t, cli, subnetBig)); err != nil {
		t.Fatalf("after TerminateInstances the /80 is still held: %v", err)
	}
}

// TestIPv6Refusals checks each EC2 refusal of AssignIpv6Addresses,
// UnassignIpv6Addresses and of attaching an ENI with IPv6: code, HTTP
// status, and that no ENI's IPv6 changed.
func TestIPv6Refusals(t *testing.T) {
	assignCount := func(cli *ec2.Client, id string, n int32) error {
		_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(id), Ipv6AddressCount: aws.Int32(n)})
		return err
	}
	assignPrefix := func(cli *ec2.Client, id string, n int32) error {
		_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(id), Ipv6PrefixCount: aws.Int32(n)})
		return err
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		code  string
		setup func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error
	}{
		{"subnet without an IPv6 CIDR", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetNoV6)
			return func() error { return assignCount(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"prefix in a subnet without an IPv6 CIDR", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetNoV6)
			return func() error { return assignPrefix(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"prefixes on a Xen type", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "c4.large", subnetBig)
			must(t, assignCount(cli, inst.PrimaryENI.ID, 1)) // addresses are fine on Xen
			return func() error { return assignPrefix(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"type without IPv6", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m1.small", subnetBig)
			return func() error { return assignCount(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"IPv6 addresses per ENI", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig) // 10 IPv6 per ENI
			must(t, assignCount(cli, inst.PrimaryENI.ID, 10))
			return func() error { return assignCount(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"a /80 counts against the per-ENI IPv6 limit", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			must(t, assignCount(cli, inst.PrimaryENI.ID, 9))
			must(t, assignPrefix(cli, inst.PrimaryENI.ID, 1))
			return func() error { return assignPrefix(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"count and prefix count together", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6AddressCount: aws.Int32(1), Ipv6PrefixCount: aws.Int32(1)})
				return err
			}
		}},
		{"nothing to assign", "MissingParameter", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID)})
				return err
			}
		}},
		{"address outside the subnet's /64", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			outside := mustSubnet(t, l.Cloud, subnetB).IPv6CIDR.Addr().Next().Next().Next().Next().Next()
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6Addresses: []string{outside.String()}})
				return err
			}
		}},
		{"reserved address", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			reserved := mustSubnet(t, l.Cloud, subnetBig).IPv6CIDR.Addr().Next()
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6Addresses: []string{reserved.String()}})
				return err
			}
		}},
		{"address inside another ENI's /80", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			b := launchIn(t, l, "m5.large", subnetBig)
			must(t, assignPrefix(cli, a.PrimaryENI.ID, 1))
			inside := mustENI(t, l.Cloud, a.PrimaryENI.ID).IPv6Prefixes[0].Addr().Next()
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(b.PrimaryENI.ID), Ipv6Addresses: []string{inside.String()}})
				return err
			}
		}},
		{"prefix that is not an aligned /80", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			bad := netip.PrefixFrom(mustSubnet(t, l.Cloud, subnetBig).IPv6CIDR.Addr(), 96).String()
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6Prefixes: []string{bad}})
				return err
			}
		}},
		{"IPv4 address as IPv6", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6Addresses: []string{"100.64.0.9"}})
				return err
			}
		}},
		{"unknown ENI", "InvalidNetworkInterfaceID.NotFound", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			return func() error { return assignCount(cli, "eni-0123456789abcdef0", 1) }
		}},
		{"unassign an address the ENI does not hold", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			b := launchIn(t, l, "m5.large", subnetBig)
			must(t, assignCount(cli, a.PrimaryENI.ID, 2))
			must(t, assignCount(cli, b.PrimaryENI.ID, 1))
			held := mustENI(t, l.Cloud, a.PrimaryENI.ID).IPv6Addresses
			foreign := mustENI(t, l.Cloud, b.PrimaryENI.ID).IPv6Addresses[0]
			return func() error {
				_, err := cli.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(a.PrimaryENI.ID), Ipv6Addresses: []string{held[0].String(), foreign.String()}})
				return err
			}
		}},
		{"unassign nothing", "MissingParameter", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(a.PrimaryENI.ID)})
				return err
			}
		}},
		{"attach an ENI with a /80 to a Xen type", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "c4.large", subnetBig)
			eni := createENI(t, cli, subnetBig)
			must(t, assignPrefix(cli, eni, 1))
			return func() error {
				_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1)})
				return err
			}
		}},
		{"attach an ENI with more IPv6 addresses than the type holds", "InvalidParameterValue", func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig) // 10 IPv6 per ENI
			eni := createENI(t, cli, subnetBig)
			must(t, assignCount(cli, eni, 11)) // unattached: any type's limit applies
			return func() error {
				_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1)})
				return err
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := vpcsimtest.Start(t, ipv6Config(9))
			cli := ec2Client(l)
			call := tc.setup(t, l, cli)
			before := l.Cloud.NetworkInterfaces()
			wantAPIError(t, call(), tc.code, 400)
			after := l.Cloud.NetworkInterfaces()
			if len(before) != len(after) {
				t.Fatalf("ENI count changed: %d → %d", len(before), len(after))
			}
			for i := range before {
				b, a := before[i], after[i]
				if !slices.Equal(b.IPv6Addresses, a.IPv6Addresses) || !slices.Equal(b.IPv6Prefixes, a.IPv6Prefixes) || b.InstanceID != a.InstanceID {
					t.Fatalf("ENI %s changed by a refused call:\n before %+v\n after  %+v", b.ID, b, a)
				}
			}
		})
	}
}

// TestIMDSIPv6: instance metadata lists an ENI's IPv6 addresses and /80
// prefixes (ipv6s, ipv6-prefix), the subnet's /64 and the VPC's /56, as an
// IPv6 node reads them, and drops what is unassigned.
func TestIMDSIPv6(t *testing.T) {
	l := vpcsimtest.Start(t, ipv6Config(11))
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	md := imdsClient(l, inst.ID)
	base := "network/interfaces/macs/" + inst.PrimaryENI.MAC + "/"
	if got, want := imdsGet(t, md, base+"subnet-ipv6-cidr-blocks"), mustSubnet(t, l.Cloud, subnetBig).IPv6CIDR.String(); got != want {
		t.Fatalf("subnet-ipv6-cidr-blocks = %q, want %q", got, want)
	}
	if got, want := imdsGet(t, md, base+"vpc-ipv6-cidr-blocks"), l.Cloud.VPCIPv6CIDR().String(); got != want {
		t.Fatalf("vpc-ipv6-cidr-blocks = %q, want %q", got, want)
	}
	pfx, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6PrefixCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	one, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6AddressCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if got := imdsGet(t, md, base+"ipv6-prefix"); got != pfx.AssignedIpv6Prefixes[0] {
		t.Fatalf("ipv6-prefix = %q, want %q", got, pfx.AssignedIpv6Prefixes[0])
	}
	if got := imdsGet(t, md, base+"ipv6s"); got != one.AssignedIpv6Addresses[0] {
		t.Fatalf("ipv6s = %q, want %q", got, one.AssignedIpv6Addresses[0])
	}
	if got := imdsGet(t, md, "ipv6"); got != one.AssignedIpv6Addresses[0] {
		t.Fatalf("ipv6 = %q, want %q", got, one.AssignedIpv6Addresses[0])
	}
	if _, err := cli.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv6Prefixes: pfx.AssignedIpv6Prefixes}); err != nil {
		t.Fatal(err)
	}
	if _, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: base + "ipv6-prefix"}); err == nil {
		t.Fatal("ipv6-prefix still served after the /80 was unassigned")
	}
}

// TestObserverSeesIPv6: IPv6 addresses (/128) and /80 prefixes assigned
// and unassigned through the SDK reach the observer, as IPv4 ones do, so
// the fabric routes them.
func TestObserverSeesIPv6(t *testing.T) {
	l := vpcsimtest.Start(t, ipv6Config(5))
	rec := &recorder{}
	l.Cloud.SetObserver(rec)
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := inst.PrimaryENI.ID
	a, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(eni), Ipv6AddressCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cli.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(eni), Ipv6PrefixCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	addr, prefix := a.AssignedIpv6Addresses[0], p.AssignedIpv6Prefixes[0]
	_, err = cli.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(eni),
		Ipv6Addresses: []string{addr}, Ipv6Prefixes: []string{prefix}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"assign " + eni + " [" + addr + "/128]",
		"assign " + eni + " [" + prefix + "]",
		"unassign " + eni + " [" + addr + "/128 " + prefix + "]",
	}
	if got := rec.events[1:]; !slices.Equal(got, want) {
		t.Fatalf("observer events after the launch:\n%q\nwant\n%q", got, want)
	}
}

// TestAssignIPv6OnCreation: in a subnet with AssignIPv6OnCreation a
// launched instance's primary ENI and a created ENI each get one IPv6
// address of the /64, the primary ENI's being IMDS's ipv6 and the address
// InstanceByAddress knows the instance by; a type without IPv6 gets none.
func TestAssignIPv6OnCreation(t *testing.T) {
	cfg := ipv6Config(6)
	cfg.Subnets[0].AssignIPv6OnCreation = true
	l := vpcsimtest.Start(t, cfg)
	inst := launchIn(t, l, "m5.large", subnetBig)
	v6 := inst.PrimaryENI.IPv6Addresses
	if len(v6) != 1 || !mustSubnet(t, l.Cloud, subnetBig).IPv6CIDR.Contains(v6[0]) {
		t.Fatalf("launched primary ENI's IPv6 %v: want one address of the subnet's /64", v6)
	}
	if got := imdsGet(t, imdsClient(l, inst.ID), "ipv6"); got != v6[0].String() {
		t.Errorf("IMDS ipv6 = %q, want %s", got, v6[0])
	}
	if id, ok := l.Cloud.InstanceByAddress(v6[0]); !ok || id != inst.ID {
		t.Errorf("InstanceByAddress(%s) = %q, %v; want %s", v6[0], id, ok, inst.ID)
	}
	if e := createENI(t, ec2Client(l), subnetBig); len(mustENI(t, l.Cloud, e).IPv6Addresses) != 1 {
		t.Errorf("created ENI's IPv6 %v, want one address", mustENI(t, l.Cloud, e).IPv6Addresses)
	}
	if old := launchIn(t, l, "m3.medium", subnetBig); len(old.PrimaryENI.IPv6Addresses) != 0 {
		t.Errorf("m3.medium (no IPv6) got %v", old.PrimaryENI.IPv6Addresses)
	}
	cfg = ipv6Config(6)
	cfg.Subnets[2].AssignIPv6OnCreation = true // the subnet without IPv6
	if _, err := vpcsim.New(cfg); err == nil {
		t.Error("AssignIPv6OnCreation on a subnet without IPv6 accepted")
	}
}
