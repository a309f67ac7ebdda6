package awsprovider

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/provider"
)

var _ provider.IPv6Assigner = (*Client)(nil)

// AssignIPv6 adds n IPv6 addresses (prefix false) or n /80 prefixes (prefix
// true) to an ENI (EC2 AssignIpv6Addresses with Ipv6AddressCount or
// Ipv6PrefixCount) and returns what EC2 added, as /128s or /80s, sorted. It
// does not wait for IMDS. EC2's refusals come back classified
// (provider.ErrNotFound, ErrInsufficientCIDR, ErrUnauthorized, ErrThrottled
// after Options.MaxThrottleWait); EC2's InvalidParameterValue (a subnet
// without an IPv6 CIDR block, a type without IPv6 or prefix delegation, the
// per-ENI limit) unclassified.
func (c *Client) AssignIPv6(ctx context.Context, eniID string, n int, prefix bool) ([]netip.Prefix, error) {
	if n < 1 {
		return nil, fmt.Errorf("AssignIPv6: count %d, want at least 1", n)
	}
	in := &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(eniID)}
	if prefix {
		in.Ipv6PrefixCount = aws.Int32(int32(n))
	} else {
		in.Ipv6AddressCount = aws.Int32(int32(n))
	}
	out, err := call(ctx, c, actAssignIPv6, func(ctx context.Context) (*ec2.AssignIpv6AddressesOutput, error) {
		return c.ec2.AssignIpv6Addresses(ctx, in)
	})
	if err != nil {
		return nil, err
	}
	var added []netip.Prefix
	for _, s := range out.AssignedIpv6Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() {
			return nil, fmt.Errorf("EC2 AssignIpv6Addresses returned address %q", s)
		}
		added = append(added, netip.PrefixFrom(a, 128))
	}
	for _, s := range out.AssignedIpv6Prefixes {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is6() {
			return nil, fmt.Errorf("EC2 AssignIpv6Addresses returned prefix %q", s)
		}
		added = append(added, p.Masked())
	}
	slices.SortFunc(added, comparePrefix)
	return added, nil
}

// UnassignIPv6 removes /128 addresses and /80 prefixes from an ENI (EC2
// UnassignIpv6Addresses, one call). An empty list does nothing; anything
// other than an IPv6 /128 or aligned /80 is refused before calling EC2.
// EC2's refusals come back classified (provider.ErrNotFound for an unknown
// ENI).
func (c *Client) UnassignIPv6(ctx context.Context, eniID string, addrs []netip.Prefix) error {
	in := &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(eniID)}
	for _, p := range addrs {
		switch {
		case !p.Addr().Is6() || p.Addr().Is4In6():
			return fmt.Errorf("UnassignIPv6: %s is not IPv6", p)
		case p.Bits() == 128:
			in.Ipv6Addresses = append(in.Ipv6Addresses, p.Addr().String())
		case p.Bits() == 80 && p == p.Masked():
			in.Ipv6Prefixes = append(in.Ipv6Prefixes, p.String())
		default:
			return fmt.Errorf("UnassignIPv6: %s is neither a /128 address nor an aligned /80 prefix", p)
		}
	}
	if len(addrs) == 0 {
		return nil
	}
	_, err := call(ctx, c, actUnassignIPv6, func(ctx context.Context) (*ec2.UnassignIpv6AddressesOutput, error) {
		return c.ec2.UnassignIpv6Addresses(ctx, in)
	})
	return err
}
