package vpcsim_test

import (
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestENILifecycleThroughSDK walks one ENI through create, attach, assign,
// unassign, detach and delete with aws-sdk-go-v2, checking the model and the
// SDK's view after each step.
func TestENILifecycleThroughSDK(t *testing.T) {
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 1})
	inst := l.Launch(t, "m5.large")
	cli := ec2Client(l)
	subnetID := inst.SubnetID
	free0 := mustSubnet(t, l.Cloud, subnetID).FreeAddresses
	if want := 4096 - 5 - 1; free0 != want {
		t.Fatalf("free addresses after launch: got %d, want %d (a /20 less 5 reserved less the primary)", free0, want)
	}

	created, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
		SubnetId:    aws.String(subnetID),
		Description: aws.String("vpcip test"),
		TagSpecifications: []types.TagSpecification{{
			ResourceType: types.ResourceTypeNetworkInterface,
			Tags:         []types.Tag{{Key: aws.String("cluster"), Value: aws.String("c1")}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	eniID := aws.ToString(created.NetworkInterface.NetworkInterfaceId)
	e := mustENI(t, l.Cloud, eniID)
	if e.Status != "available" || e.Description != "vpcip test" || e.Tags["cluster"] != "c1" {
		t.Fatalf("created ENI state: %+v", e)
	}
	if len(eniID) != len("eni-")+17 || aws.ToString(created.NetworkInterface.MacAddress) != e.MAC {
		t.Fatalf("ENI id %q / MAC %q do not match the model", eniID, aws.ToString(created.NetworkInterface.MacAddress))
	}

	att, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
		NetworkInterfaceId: aws.String(eniID), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	e = mustENI(t, l.Cloud, eniID)
	if e.Status != "in-use" || e.InstanceID != inst.ID || e.DeviceIndex != 1 || e.AttachmentID != aws.ToString(att.AttachmentId) {
		t.Fatalf("attached ENI state: %+v (attachment %s)", e, aws.ToString(att.AttachmentId))
	}

	asg, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(eniID), SecondaryPrivateIpAddressCount: aws.Int32(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range asg.AssignedPrivateIpAddresses {
		got = append(got, aws.ToString(a.PrivateIpAddress))
	}
	e = mustENI(t, l.Cloud, eniID)
	if diff := cmp.Diff(addrs(got), e.SecondaryIPs, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("assigned addresses differ from the model (-sdk +model):\n%s", diff)
	}
	if f := mustSubnet(t, l.Cloud, subnetID).FreeAddresses; f != free0-4 {
		t.Fatalf("free after ENI + 3 secondaries: got %d, want %d", f, free0-4)
	}

	desc, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{inst.ID}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(desc.NetworkInterfaces) != 2 {
		t.Fatalf("DescribeNetworkInterfaces by instance: got %d ENIs, want 2", len(desc.NetworkInterfaces))
	}
	for _, ni := range desc.NetworkInterfaces {
		if aws.ToString(ni.NetworkInterfaceId) != eniID {
			continue
		}
		if len(ni.PrivateIpAddresses) != 4 || !aws.ToBool(ni.PrivateIpAddresses[0].Primary) ||
			aws.ToInt32(ni.Attachment.DeviceIndex) != 1 || ni.Attachment.Status != types.AttachmentStatusAttached {
			t.Fatalf("described ENI: %+v", ni)
		}
	}

	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(eniID), PrivateIpAddresses: got[:2],
	}); err != nil {
		t.Fatal(err)
	}
	e = mustENI(t, l.Cloud, eniID)
	if len(e.SecondaryIPs) != 1 || e.SecondaryIPs[0].String() != got[2] {
		t.Fatalf("after unassign: secondaries %v, want [%s]", e.SecondaryIPs, got[2])
	}

	if _, err := cli.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: att.AttachmentId}); err != nil {
		t.Fatal(err)
	}
	if e = mustENI(t, l.Cloud, eniID); e.Status != "available" || e.InstanceID != "" {
		t.Fatalf("after detach: %+v", e)
	}
	if _, err := cli.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(eniID)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Cloud.NetworkInterface(eniID); ok {
		t.Fatal("ENI still in the model after delete")
	}
	if f := mustSubnet(t, l.Cloud, subnetID).FreeAddresses; f != free0 {
		t.Fatalf("free after delete: got %d, want %d", f, free0)
	}
}

// TestDescribeInstancesAndTypes checks the instance and instance-type views
// against the model and the embedded EC2 figures.
func TestDescribeInstancesAndTypes(t *testing.T) {
	l := vpcsimtest.Start(t, vpcsim.Config{})
	inst := l.Launch(t, "t3.small")
	cli := ec2Client(l)
	out, err := cli.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{inst.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Reservations) != 1 || len(out.Reservations[0].Instances) != 1 {
		t.Fatalf("reservations: %+v", out.Reservations)
	}
	got := out.Reservations[0].Instances[0]
	if got.InstanceType != "t3.small" || aws.ToString(got.PrivateIpAddress) != inst.PrimaryENI.PrimaryIP.String() ||
		aws.ToString(got.Placement.AvailabilityZone) != "us-west-2a" || got.State.Name != types.InstanceStateNameRunning ||
		len(got.NetworkInterfaces) != 1 || aws.ToString(got.NetworkInterfaces[0].NetworkInterfaceId) != inst.PrimaryENI.ID {
		t.Fatalf("described instance does not match the model: %+v", got)
	}

	types, err := cli.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"m5.large", "t3.nano", "c5.18xlarge"}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int32{"m5.large": {3, 10}, "t3.nano": {2, 2}, "c5.18xlarge": {15, 50}}
	if len(types.InstanceTypes) != 3 {
		t.Fatalf("got %d types, want 3", len(types.InstanceTypes))
	}
	for _, it := range types.InstanceTypes {
		w := want[string(it.InstanceType)]
		ni := it.NetworkInfo
		if aws.ToInt32(ni.MaximumNetworkInterfaces) != w[0] || aws.ToInt32(ni.Ipv4AddressesPerInterface) != w[1] || it.Hypervisor != "nitro" {
			t.Fatalf("%s: got %d ENIs × %d IPv4 (%s), want %v", it.InstanceType, aws.ToInt32(ni.MaximumNetworkInterfaces), aws.ToInt32(ni.Ipv4AddressesPerInterface), it.Hypervisor, w)
		}
	}
}

// TestIMDSThroughSDK reads the instance's metadata through feature/ec2/imds.
func TestIMDSThroughSDK(t *testing.T) {
	l := vpcsimtest.Start(t, vpcsim.Config{})
	inst := l.Launch(t, "m5.large")
	cli := ec2Client(l)
	if _, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), SecondaryPrivateIpAddressCount: aws.Int32(2),
	}); err != nil {
		t.Fatal(err)
	}
	md := imdsClient(l, inst.ID)
	get := func(path string) string {
		t.Helper()
		out, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	e := mustENI(t, l.Cloud, inst.PrimaryENI.ID)
	mac := e.MAC
	wantIPs := []string{e.PrimaryIP.String()}
	for _, a := range e.SecondaryIPs {
		wantIPs = append(wantIPs, a.String())
	}
	checks := map[string]string{
		"instance-id":                 inst.ID,
		"instance-type":               "m5.large",
		"placement/availability-zone": "us-west-2a",
		"placement/region":            "us-west-2",
		"mac":                         mac,
		"local-ipv4":                  e.PrimaryIP.String(),
		"network/interfaces/macs/" + mac + "/device-number":          "0",
		"network/interfaces/macs/" + mac + "/interface-id":           e.ID,
		"network/interfaces/macs/" + mac + "/local-ipv4s":            strings.Join(wantIPs, "\n"),
		"network/interfaces/macs/" + mac + "/subnet-id":              e.SubnetID,
		"network/interfaces/macs/" + mac + "/subnet-ipv4-cidr-block": "100.64.0.0/20",
		"network/interfaces/macs/" + mac + "/vpc-ipv4-cidr-blocks":   "100.64.0.0/16",
		"network/interfaces/macs/":                                   mac + "/",
	}
	for path, want := range checks {
		if got := get(path); got != want {
			t.Errorf("IMDS %s: got %q, want %q", path, got, want)
		}
	}
	region, err := md.GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil || region.Region != "us-west-2" {
		t.Fatalf("GetRegion: %v %v", region, err)
	}
	doc, err := md.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
	if err != nil || doc.InstanceID != inst.ID || doc.PrivateIP != e.PrimaryIP.String() {
		t.Fatalf("identity document: %+v %v", doc, err)
	}
	if l.Cloud.Faults().Calls(vpcsim.IMDSOp) < len(checks) {
		t.Fatalf("IMDS GET counter %d below %d", l.Cloud.Faults().Calls(vpcsim.IMDSOp), len(checks))
	}
	if !slices.Contains(strings.Split(get(""), "\n"), "network/") {
		t.Fatalf("meta-data listing lacks network/: %q", get(""))
	}
}
