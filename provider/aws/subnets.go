package awsprovider

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/provider"
)

// Subnets lists subnets from EC2 DescribeSubnets (SubnetId.N for q.IDs,
// filters vpc-id, the VPC of this instance's primary ENI from IMDS, and
// availability-zone for q.Zone), every page of Options.PageSize, sorted by
// ID. A named subnet that does not exist fails the call with
// provider.ErrNotFound (EC2 InvalidSubnetID.NotFound). Each listed subnet's
// CIDR is cached for ENI listings.
func (c *Client) Subnets(ctx context.Context, q provider.SubnetQuery) ([]provider.Subnet, error) {
	in := &ec2.DescribeSubnetsInput{SubnetIds: slices.Clone(q.IDs)}
	if len(q.IDs) == 0 {
		id, err := c.identity(ctx)
		if err != nil {
			return nil, err
		}
		if id.vpcID == "" {
			return nil, fmt.Errorf("IMDS reports no vpc-id for the primary ENI: %w", provider.ErrNotFound)
		}
		in.Filters = append(in.Filters, filter("vpc-id", id.vpcID))
	}
	if q.Zone != "" {
		in.Filters = append(in.Filters, filter("availability-zone", q.Zone))
	}
	if len(q.IDs) == 0 { // EC2 refuses MaxResults together with SubnetId.N
		in.MaxResults = aws.Int32(c.opts.PageSize)
	}
	var out []provider.Subnet
	for {
		page, err := call(ctx, c, actDescribeSubnets, func(ctx context.Context) (*ec2.DescribeSubnetsOutput, error) {
			return c.ec2.DescribeSubnets(ctx, in)
		})
		if err != nil {
			return nil, err
		}
		for _, s := range page.Subnets {
			sub, err := convertSubnet(s)
			if err != nil {
				return nil, err
			}
			out = append(out, sub)
		}
		if aws.ToString(page.NextToken) == "" {
			break
		}
		in.NextToken = page.NextToken
	}
	slices.SortFunc(out, func(a, b provider.Subnet) int { return strings.Compare(a.ID, b.ID) })
	c.cacheMu.Lock()
	for _, s := range out {
		c.subnets[s.ID] = s.CIDR
	}
	c.cacheMu.Unlock()
	return out, nil
}

func convertSubnet(s types.Subnet) (provider.Subnet, error) {
	sub := provider.Subnet{
		ID: aws.ToString(s.SubnetId), VPCID: aws.ToString(s.VpcId), AvailabilityZone: aws.ToString(s.AvailabilityZone),
		FreeAddresses: int(aws.ToInt32(s.AvailableIpAddressCount)), Tags: map[string]string{},
	}
	p, err := netip.ParsePrefix(aws.ToString(s.CidrBlock))
	if err != nil || !p.Addr().Is4() {
		return sub, fmt.Errorf("EC2 reports subnet %s with CIDR %q: want an IPv4 prefix", sub.ID, aws.ToString(s.CidrBlock))
	}
	sub.CIDR = p.Masked()
	for _, t := range s.Tags {
		sub.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return sub, nil
}
