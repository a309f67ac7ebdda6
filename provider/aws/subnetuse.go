package awsprovider

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// AssignAddressesAt adds the named secondary addresses to an ENI of this
// instance (EC2 AssignPrivateIpAddresses with PrivateIpAddresses, without
// AllowReassignment, so an address another ENI holds is refused rather than
// taken) and returns them as /32 prefixes, sorted, once IMDS shows them.
// EC2 refuses the whole request when one address is held elsewhere
// (InvalidIPAddress.InUse, classified as provider.ErrAddressInUse, or
// InvalidParameterValue "Address ... is in use", left unclassified); other
// refusals are classified as for AssignAddresses.
func (c *Client) AssignAddressesAt(ctx context.Context, eniID string, addrs []netip.Addr) ([]netip.Prefix, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("AssignAddressesAt: no address named")
	}
	ips := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if !a.Is4() {
			return nil, fmt.Errorf("AssignAddressesAt: %s is not IPv4", a)
		}
		ips = append(ips, a.String())
	}
	in := &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eniID), PrivateIpAddresses: ips}
	out, err := call(ctx, c, actAssignPrivateIPs, func(ctx context.Context) (*ec2.AssignPrivateIpAddressesOutput, error) {
		return c.ec2.AssignPrivateIpAddresses(ctx, in)
	})
	if err != nil {
		return nil, err
	}
	added := make([]netip.Prefix, 0, len(out.AssignedPrivateIpAddresses))
	for _, a := range out.AssignedPrivateIpAddresses {
		addr, err := netip.ParseAddr(aws.ToString(a.PrivateIpAddress))
		if err != nil {
			return nil, fmt.Errorf("EC2 AssignPrivateIpAddresses returned address %q: %w", aws.ToString(a.PrivateIpAddress), err)
		}
		added = append(added, netip.PrefixFrom(addr, 32))
	}
	slices.SortFunc(added, comparePrefix)
	c.meta.assigned(eniID, added)
	return added, c.waitAssigned(ctx, eniID, added)
}

// SubnetUsage lists the addresses and /28 prefixes every ENI in the subnet
// holds, this cluster's or not (EC2 DescribeNetworkInterfaces filtered by
// subnet-id, Options.PageSize per page, each page one call paced by the
// describe budget): primary and secondary private addresses as /32s,
// delegated prefixes as /28s, sorted and without duplicates. An unknown
// subnet lists nothing.
func (c *Client) SubnetUsage(ctx context.Context, subnetID string) ([]netip.Prefix, error) {
	if subnetID == "" {
		return nil, fmt.Errorf("SubnetUsage: no subnet named")
	}
	nis, err := c.describeENIs(ctx, []types.Filter{filter("subnet-id", subnetID)})
	if err != nil {
		return nil, err
	}
	var used []netip.Prefix
	for _, ni := range nis {
		for _, a := range ni.PrivateIpAddresses {
			addr, err := netip.ParseAddr(aws.ToString(a.PrivateIpAddress))
			if err != nil {
				return nil, fmt.Errorf("EC2 DescribeNetworkInterfaces: %s lists address %q: %w", aws.ToString(ni.NetworkInterfaceId), aws.ToString(a.PrivateIpAddress), err)
			}
			used = append(used, netip.PrefixFrom(addr, 32))
		}
		for _, p := range ni.Ipv4Prefixes {
			pfx, err := netip.ParsePrefix(aws.ToString(p.Ipv4Prefix))
			if err != nil {
				return nil, fmt.Errorf("EC2 DescribeNetworkInterfaces: %s lists prefix %q: %w", aws.ToString(ni.NetworkInterfaceId), aws.ToString(p.Ipv4Prefix), err)
			}
			used = append(used, pfx.Masked())
		}
	}
	slices.SortFunc(used, comparePrefix)
	return slices.Compact(used), nil
}
