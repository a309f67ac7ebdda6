package awsprovider

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/vpcip/vpcip/provider"
)

// TestSubnetUsageListsEveryENI checks SubnetUsage against vpcsim through
// the SDK: every ENI of the subnet, this instance's or another's, attached
// or not, over several pages (PageSize 5), with primaries, secondaries and
// prefixes; nothing of other subnets.
func TestSubnetUsageListsEveryENI(t *testing.T) {
	s := startSim(t)
	c := s.client(t, testOptions(), "")
	raw := s.raw(t)
	other := s.local.Launch(t, testType)
	if _, err := raw.AssignPrivateIpAddresses(t.Context(), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.3.33"}}); err != nil {
		t.Fatal(err)
	}
	pfx, err := c.AssignAddresses(t.Context(), s.inst.PrimaryENI.ID, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.PrefixFrom(s.inst.PrimaryENI.PrimaryIP, 32), netip.PrefixFrom(other.PrimaryENI.PrimaryIP, 32),
		netip.MustParsePrefix("100.64.3.33/32"), pfx[0]}
	for range 6 { // unattached ENIs, more than a page
		out, err := raw.CreateNetworkInterface(t.Context(), &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(s.inst.SubnetID)})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, netip.PrefixFrom(netip.MustParseAddr(aws.ToString(out.NetworkInterface.PrivateIpAddress)), 32))
	}
	if _, err := raw.CreateNetworkInterface(t.Context(), &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(s.small)}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want, comparePrefix)
	got, err := c.SubnetUsage(t.Context(), s.inst.SubnetID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("SubnetUsage = %v\nwant %v", got, want)
	}
	if got, err := c.SubnetUsage(t.Context(), "subnet-0123456789abcdef0"); err != nil || len(got) != 0 {
		t.Fatalf("SubnetUsage(unknown subnet) = %v, %v; want nothing", got, err)
	}
}

// TestAssignAddressesAt checks naming addresses against vpcsim through the
// SDK: a free address is assigned and shows in metadata; one held by another
// ENI is refused with nothing assigned, so the caller can fall back.
func TestAssignAddressesAt(t *testing.T) {
	s := startSim(t)
	c := s.client(t, testOptions(), "")
	raw := s.raw(t)
	other := s.local.Launch(t, testType)
	if _, err := raw.AssignPrivateIpAddresses(t.Context(), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(other.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.0.20"}}); err != nil {
		t.Fatal(err)
	}
	eni := s.inst.PrimaryENI.ID
	got, err := c.AssignAddressesAt(t.Context(), eni, []netip.Addr{netip.MustParseAddr("100.64.0.22"), netip.MustParseAddr("100.64.0.21")})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("100.64.0.21/32"), netip.MustParsePrefix("100.64.0.22/32")}
	if !slices.Equal(got, want) {
		t.Fatalf("AssignAddressesAt = %v, want %v", got, want)
	}
	metaENIs, err := c.MetadataENIs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(metaENIs, func(e provider.ENI) bool { return e.ID == eni }); i < 0 ||
		!slices.Contains(metaENIs[i].SecondaryIPs, netip.MustParseAddr("100.64.0.21")) {
		t.Fatalf("metadata does not show the named addresses: %+v", metaENIs)
	}
	_, err = c.AssignAddressesAt(t.Context(), eni, []netip.Addr{netip.MustParseAddr("100.64.0.23"), netip.MustParseAddr("100.64.0.20")})
	var ae smithy.APIError
	if err == nil || !errors.As(err, &ae) || ae.ErrorCode() != "InvalidParameterValue" {
		t.Fatalf("naming an address another ENI holds: err = %v, want EC2 InvalidParameterValue", err)
	}
	e, _ := s.local.Cloud.NetworkInterface(eni)
	if slices.Contains(e.SecondaryIPs, netip.MustParseAddr("100.64.0.23")) {
		t.Fatalf("a refused request assigned 100.64.0.23: %v", e.SecondaryIPs)
	}
	if _, err := c.AssignAddressesAt(t.Context(), eni, nil); err == nil {
		t.Fatal("AssignAddressesAt with no address: no error")
	}
	if _, err := c.AssignAddressesAt(t.Context(), eni, []netip.Addr{netip.MustParseAddr("fd00::1")}); err == nil {
		t.Fatal("AssignAddressesAt with an IPv6 address: no error")
	}
}
