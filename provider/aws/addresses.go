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

// AssignAddresses adds n secondary addresses (prefix false) or n /28
// prefixes (prefix true) to an ENI of this instance (EC2
// AssignPrivateIpAddresses with SecondaryPrivateIpAddressCount or
// Ipv4PrefixCount) and returns what EC2 added, as /32 or /28 prefixes,
// sorted, once IMDS shows all of it. EC2's refusals come back as
// provider.ErrAddressLimit, ErrSubnetFull, ErrInsufficientCIDR, ErrNotFound
// (no such ENI), ErrUnauthorized or, after Options.MaxThrottleWait,
// ErrThrottled. When IMDS does not show the additions within
// Options.MetadataWait they are still returned, with an error wrapping
// provider.ErrNotVisible.
func (c *Client) AssignAddresses(ctx context.Context, eniID string, n int, prefix bool) ([]netip.Prefix, error) {
	if n < 1 {
		return nil, fmt.Errorf("AssignAddresses: count %d, want at least 1", n)
	}
	in := &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eniID)}
	if prefix {
		in.Ipv4PrefixCount = aws.Int32(int32(n))
	} else {
		in.SecondaryPrivateIpAddressCount = aws.Int32(int32(n))
	}
	out, err := call(ctx, c, actAssignPrivateIPs, func(ctx context.Context) (*ec2.AssignPrivateIpAddressesOutput, error) {
		return c.ec2.AssignPrivateIpAddresses(ctx, in)
	})
	if err != nil {
		return nil, err
	}
	var added []netip.Prefix
	for _, a := range out.AssignedPrivateIpAddresses {
		addr, err := netip.ParseAddr(aws.ToString(a.PrivateIpAddress))
		if err != nil {
			return nil, fmt.Errorf("EC2 AssignPrivateIpAddresses returned address %q: %w", aws.ToString(a.PrivateIpAddress), err)
		}
		added = append(added, netip.PrefixFrom(addr, 32))
	}
	for _, p := range out.AssignedIpv4Prefixes {
		pfx, err := netip.ParsePrefix(aws.ToString(p.Ipv4Prefix))
		if err != nil {
			return nil, fmt.Errorf("EC2 AssignPrivateIpAddresses returned prefix %q: %w", aws.ToString(p.Ipv4Prefix), err)
		}
		added = append(added, pfx.Masked())
	}
	slices.SortFunc(added, comparePrefix)
	c.meta.assigned(eniID, added)
	return added, c.waitAssigned(ctx, eniID, added)
}

// waitAssigned waits until IMDS shows added on eniID and records it.
func (c *Client) waitAssigned(ctx context.Context, eniID string, added []netip.Prefix) error {
	mac, err := c.macOf(ctx, eniID)
	if err != nil {
		return fmt.Errorf("AssignAddresses: %d added to %s, but its MAC is not in IMDS (%w): %w", len(added), eniID, err, provider.ErrNotVisible)
	}
	listed, err := c.waitMetadata(ctx, mac, eniID, added)
	if err != nil {
		return fmt.Errorf("AssignAddresses: %d added to %s: %w", len(added), eniID, err)
	}
	if err := c.recordVisible(ctx, mac, eniID, listed); err != nil {
		return fmt.Errorf("AssignAddresses: %d added to %s, its metadata unreadable (%w): %w", len(added), eniID, err, provider.ErrNotVisible)
	}
	return nil
}

// UnassignAddresses removes /32 secondary addresses and /28 prefixes from an
// ENI (EC2 UnassignPrivateIpAddresses, one call for addresses and one for
// prefixes). An empty list does nothing. Anything other than an IPv4 /32 or
// /28 is refused before calling EC2; EC2's refusals come back classified
// (provider.ErrNotFound for an unknown ENI). From then on MetadataENIs does
// not report them, even while IMDS still lists them.
func (c *Client) UnassignAddresses(ctx context.Context, eniID string, addrs []netip.Prefix) error {
	var ips, prefixes []string
	for _, p := range addrs {
		switch {
		case !p.Addr().Is4():
			return fmt.Errorf("UnassignAddresses: %s is not IPv4", p)
		case p.Bits() == 32:
			ips = append(ips, p.Addr().String())
		case p.Bits() == 28 && p == p.Masked():
			prefixes = append(prefixes, p.String())
		default:
			return fmt.Errorf("UnassignAddresses: %s is neither a /32 address nor an aligned /28 prefix", p)
		}
	}
	if len(ips) > 0 {
		if err := c.unassign(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eniID), PrivateIpAddresses: ips}); err != nil {
			return err
		}
	}
	if len(prefixes) > 0 {
		if err := c.unassign(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eniID), Ipv4Prefixes: prefixes}); err != nil {
			return err
		}
	}
	c.meta.unassigned(eniID, addrs)
	return nil
}

func (c *Client) unassign(ctx context.Context, in *ec2.UnassignPrivateIpAddressesInput) error {
	_, err := call(ctx, c, actUnassignPrivateIPs, func(ctx context.Context) (*ec2.UnassignPrivateIpAddressesOutput, error) {
		return c.ec2.UnassignPrivateIpAddresses(ctx, in)
	})
	return err
}
