package vpcsim_test

import (
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

func describeIDs(t *testing.T, cli *ec2.Client, in *ec2.DescribeNetworkInterfacesInput) []string {
	t.Helper()
	var ids []string
	p := ec2.NewDescribeNetworkInterfacesPaginator(cli, in)
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ni := range out.NetworkInterfaces {
			ids = append(ids, aws.ToString(ni.NetworkInterfaceId))
		}
	}
	slices.Sort(ids)
	return ids
}

func sorted(ids ...string) []string {
	return slices.Sorted(slices.Values(ids))
}

// TestDescribeNetworkInterfacesFilters checks each filter the daemon uses
// against a small, known set of ENIs.
func TestDescribeNetworkInterfacesFilters(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	other := launchIn(t, l, "m5.large", subnetB)
	tagged, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
		SubnetId: aws.String(subnetBig), Description: aws.String("vpcip pool"),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: []types.Tag{
			{Key: aws.String("vpcip.io/node"), Value: aws.String(inst.ID)}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	pool := aws.ToString(tagged.NetworkInterface.NetworkInterfaceId)
	attach(t, cli, pool, inst.ID, 1)
	loose := createENI(t, cli, subnetB)
	sec := assign(t, cli, pool, 1)[0]

	f := func(name string, values ...string) types.Filter {
		return types.Filter{Name: aws.String(name), Values: values}
	}
	tests := []struct {
		name    string
		filters []types.Filter
		ids     []string
		want    []string
	}{
		{"attachment.instance-id", []types.Filter{f("attachment.instance-id", inst.ID)}, nil, sorted(inst.PrimaryENI.ID, pool)},
		{"attachment.status", []types.Filter{f("attachment.status", "attached")}, nil, sorted(inst.PrimaryENI.ID, pool, other.PrimaryENI.ID)},
		{"status available", []types.Filter{f("status", "available")}, nil, sorted(loose)},
		{"status in-use", []types.Filter{f("status", "in-use")}, nil, sorted(inst.PrimaryENI.ID, pool, other.PrimaryENI.ID)},
		{"subnet-id", []types.Filter{f("subnet-id", subnetB)}, nil, sorted(other.PrimaryENI.ID, loose)},
		{"vpc-id", []types.Filter{f("vpc-id", l.Cloud.VPCID())}, nil, sorted(inst.PrimaryENI.ID, pool, other.PrimaryENI.ID, loose)},
		{"vpc-id other", []types.Filter{f("vpc-id", "vpc-0123456789abcdef0")}, nil, nil},
		{"tag-key", []types.Filter{f("tag-key", "vpcip.io/node")}, nil, sorted(pool)},
		{"tag:key", []types.Filter{f("tag:vpcip.io/node", inst.ID)}, nil, sorted(pool)},
		{"tag:key wildcard", []types.Filter{f("tag:vpcip.io/node", "i-*")}, nil, sorted(pool)},
		{"tag:key other value", []types.Filter{f("tag:vpcip.io/node", other.ID)}, nil, nil},
		{"description", []types.Filter{f("description", "vpcip*")}, nil, sorted(pool)},
		{"private address", []types.Filter{f("addresses.private-ip-address", sec)}, nil, sorted(pool)},
		{"two filters AND", []types.Filter{f("subnet-id", subnetBig), f("status", "in-use", "available")}, nil, sorted(inst.PrimaryENI.ID, pool)},
		{"ids", nil, []string{loose, pool}, sorted(pool, loose)},
		{"ids and filter", []types.Filter{f("status", "available")}, []string{loose, pool}, sorted(loose)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describeIDs(t, cli, &ec2.DescribeNetworkInterfacesInput{Filters: tt.filters, NetworkInterfaceIds: tt.ids})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("ENIs (-want +got):\n%s", diff)
			}
		})
	}
	_, err = cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{f("no-such-filter", "x")}})
	wantAPIError(t, err, "InvalidParameterValue", 400)
}

// TestPagination pages through ENIs, instances, subnets and instance types
// with the SDK's paginators and checks every item comes exactly once.
func TestPagination(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	var want []string
	for range 12 {
		want = append(want, createENI(t, cli, subnetBig))
	}
	for range 6 {
		want = append(want, launchIn(t, l, "t3.nano", subnetB).PrimaryENI.ID)
	}
	slices.Sort(want)
	pages := 0
	var got []string
	p := ec2.NewDescribeNetworkInterfacesPaginator(cli, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(5)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.NetworkInterfaces) > 5 {
			t.Fatalf("page of %d, MaxResults 5", len(out.NetworkInterfaces))
		}
		pages++
		for _, ni := range out.NetworkInterfaces {
			got = append(got, aws.ToString(ni.NetworkInterfaceId))
		}
	}
	if pages != 4 {
		t.Fatalf("18 ENIs by 5: got %d pages, want 4", pages)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("paged ENIs (-want +got):\n%s", diff)
	}

	inst := 0
	ip := ec2.NewDescribeInstancesPaginator(cli, &ec2.DescribeInstancesInput{MaxResults: aws.Int32(5)})
	for ip.HasMorePages() {
		out, err := ip.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		inst += len(out.Reservations)
	}
	if inst != 6 {
		t.Fatalf("paged instances: %d, want 6", inst)
	}

	sp := ec2.NewDescribeSubnetsPaginator(cli, &ec2.DescribeSubnetsInput{MaxResults: aws.Int32(5), Filters: []types.Filter{
		{Name: aws.String("availability-zone"), Values: []string{"us-west-2a"}}}})
	var subnets []string
	for sp.HasMorePages() {
		out, err := sp.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range out.Subnets {
			subnets = append(subnets, aws.ToString(s.SubnetId))
			info := mustSubnet(t, l.Cloud, aws.ToString(s.SubnetId))
			if int(aws.ToInt32(s.AvailableIpAddressCount)) != info.FreeAddresses || aws.ToString(s.CidrBlock) != info.CIDR.String() {
				t.Fatalf("subnet %s: SDK %d free %s, model %+v", info.ID, aws.ToInt32(s.AvailableIpAddressCount), aws.ToString(s.CidrBlock), info)
			}
		}
	}
	if diff := cmp.Diff([]string{subnetBig, subnetTiny, subnetFrag}, subnets); diff != "" {
		t.Fatalf("subnets in us-west-2a (-want +got):\n%s", diff)
	}

	tp := ec2.NewDescribeInstanceTypesPaginator(cli, &ec2.DescribeInstanceTypesInput{})
	seen := map[types.InstanceType]bool{}
	for tp.HasMorePages() {
		out, err := tp.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range out.InstanceTypes {
			if seen[it.InstanceType] {
				t.Fatalf("instance type %s twice", it.InstanceType)
			}
			seen[it.InstanceType] = true
		}
	}
	if len(seen) != 1373 {
		t.Fatalf("paged instance types: %d, want 1373", len(seen))
	}

	_, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(4)})
	wantAPIError(t, err, "InvalidParameterValue", 400)
	_, err = cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(5), NetworkInterfaceIds: want[:1]})
	wantAPIError(t, err, "InvalidParameterCombination", 400)
	_, err = cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NextToken: aws.String("!!not a token")})
	wantAPIError(t, err, "InvalidPaginationToken", 400)
}

func TestDescribeSubnetsAndSecurityGroups(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	out, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{Filters: []types.Filter{{Name: aws.String("tag:tier"), Values: []string{"b"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Subnets) != 1 || aws.ToString(out.Subnets[0].SubnetId) != subnetB || aws.ToString(out.Subnets[0].AvailabilityZone) != "us-west-2b" ||
		aws.ToString(out.Subnets[0].VpcId) != l.Cloud.VPCID() || aws.ToInt32(out.Subnets[0].AvailableIpAddressCount) != 4096-5 {
		t.Fatalf("subnets by tag: %+v", out.Subnets)
	}
	out, err = cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{subnetTiny}})
	if err != nil || len(out.Subnets) != 1 || aws.ToInt32(out.Subnets[0].AvailableIpAddressCount) != 32-5 {
		t.Fatalf("tiny subnet: %+v %v", out, err)
	}
	_, err = cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{"subnet-0123456789abcdef0"}})
	wantAPIError(t, err, "InvalidSubnetID.NotFound", 400)

	groups := mustDescribeGroups(t, cli)
	g, err := cli.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{{Name: aws.String("vpc-id"), Values: []string{l.Cloud.VPCID()}}}})
	if err != nil || len(g.SecurityGroups) != 1 || aws.ToString(g.SecurityGroups[0].GroupId) != aws.ToString(groups[0].GroupId) {
		t.Fatalf("groups by vpc: %+v %v", g, err)
	}
	inst := launchIn(t, l, "m5.large", subnetBig)
	if !slices.Equal(inst.PrimaryENI.SecurityGroups, []string{aws.ToString(groups[0].GroupId)}) {
		t.Fatalf("primary ENI groups %v, want the default group", inst.PrimaryENI.SecurityGroups)
	}
}

// TestDescribeFiltersOtherResources covers the instance, instance-type,
// subnet and security-group filters.
func TestDescribeFiltersOtherResources(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	a := launchIn(t, l, "m5.large", subnetBig)
	b := launchIn(t, l, "t3.nano", subnetB)
	if err := l.Cloud.TerminateInstance(b.ID); err != nil {
		t.Fatal(err)
	}
	f := func(name string, values ...string) []types.Filter {
		return []types.Filter{{Name: aws.String(name), Values: values}}
	}
	instances := func(filters []types.Filter) []string {
		t.Helper()
		out, err := cli.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: filters})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range out.Reservations {
			for _, i := range r.Instances {
				ids = append(ids, aws.ToString(i.InstanceId))
			}
		}
		slices.Sort(ids)
		return ids
	}
	for _, tt := range []struct {
		name    string
		filters []types.Filter
		want    []string
	}{
		{"state running", f("instance-state-name", "running"), []string{a.ID}},
		{"state terminated", f("instance-state-name", "terminated"), []string{b.ID}},
		{"type", f("instance-type", "t3.*"), []string{b.ID}},
		{"zone", f("availability-zone", "us-west-2a"), []string{a.ID}},
		{"primary address", f("private-ip-address", a.PrimaryENI.PrimaryIP.String()), []string{a.ID}},
		{"ENI id", f("network-interface.network-interface-id", a.PrimaryENI.ID), []string{a.ID}},
		{"subnet", f("subnet-id", subnetB), []string{b.ID}},
		{"vpc", f("vpc-id", l.Cloud.VPCID()), sorted(a.ID, b.ID)},
	} {
		if diff := cmp.Diff(tt.want, instances(tt.filters)); diff != "" {
			t.Errorf("instances %s (-want +got):\n%s", tt.name, diff)
		}
	}

	it, err := cli.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{Filters: []types.Filter{
		{Name: aws.String("hypervisor"), Values: []string{"xen"}},
		{Name: aws.String("network-info.maximum-network-interfaces"), Values: []string{"8"}},
		{Name: aws.String("processor-info.supported-architecture"), Values: []string{"x86_64"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range it.InstanceTypes {
		if x.Hypervisor != types.InstanceTypeHypervisorXen || aws.ToInt32(x.NetworkInfo.MaximumNetworkInterfaces) != 8 {
			t.Fatalf("filtered type %s: %s, %d ENIs", x.InstanceType, x.Hypervisor, aws.ToInt32(x.NetworkInfo.MaximumNetworkInterfaces))
		}
	}
	if len(it.InstanceTypes) == 0 {
		t.Fatal("no Xen type with 8 ENIs")
	}
	metal, err := cli.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{Filters: []types.Filter{{Name: aws.String("bare-metal"), Values: []string{"true"}}}, MaxResults: aws.Int32(100)})
	if err != nil || len(metal.InstanceTypes) == 0 || !aws.ToBool(metal.InstanceTypes[0].BareMetal) {
		t.Fatalf("bare-metal filter: %v %v", metal, err)
	}
	_, err = cli.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"m5.nonesuch"}})
	wantAPIError(t, err, "InvalidInstanceType", 400)

	sn, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{Filters: []types.Filter{
		{Name: aws.String("cidr-block"), Values: []string{"100.64.16.*"}},
		{Name: aws.String("vpc-id"), Values: []string{l.Cloud.VPCID()}},
	}})
	if err != nil || len(sn.Subnets) != 2 {
		t.Fatalf("subnets by cidr-block: %v %v", sn, err)
	}
	groups := mustDescribeGroups(t, cli)
	g, err := cli.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: []string{aws.ToString(groups[0].GroupId)}})
	if err != nil || len(g.SecurityGroups) != 1 {
		t.Fatalf("group by id: %v %v", g, err)
	}
	_, err = cli.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: []string{"sg-0123456789abcdef0"}})
	wantAPIError(t, err, "InvalidGroup.NotFound", 400)
}
