package awsprovider

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/provider"
)

// Limits returns the network limits of an instance type: from the built-in
// table (limits_table.go, generated from EC2 DescribeInstanceTypes figures
// for 1,373 types) or, for a type the table lacks, from EC2
// DescribeInstanceTypes, cached for the client's life. MaxENIs counts the
// default network card only. An unknown type returns an error wrapping
// provider.ErrNotFound.
func (c *Client) Limits(ctx context.Context, instanceType string) (provider.Limits, error) {
	if instanceType == "" {
		return provider.Limits{}, errors.New("Limits: empty instance type")
	}
	if l, ok := c.table[instanceType]; ok {
		return l, nil
	}
	c.cacheMu.Lock()
	l, ok := c.limits[instanceType]
	c.cacheMu.Unlock()
	if ok {
		return l, nil
	}
	out, err := call(ctx, c, actDescribeInstanceTypes, func(ctx context.Context) (*ec2.DescribeInstanceTypesOutput, error) {
		return c.ec2.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{types.InstanceType(instanceType)}})
	})
	if err != nil {
		return provider.Limits{}, err
	}
	if len(out.InstanceTypes) != 1 || out.InstanceTypes[0].NetworkInfo == nil {
		return provider.Limits{}, fmt.Errorf("EC2 DescribeInstanceTypes: %s: %w", instanceType, provider.ErrNotFound)
	}
	l = limitsOf(out.InstanceTypes[0])
	if l.MaxENIs < 1 || l.IPv4PerENI < 1 {
		return provider.Limits{}, fmt.Errorf("EC2 DescribeInstanceTypes: %s has %d ENIs × %d addresses", instanceType, l.MaxENIs, l.IPv4PerENI)
	}
	c.cacheMu.Lock()
	c.limits[instanceType] = l
	c.cacheMu.Unlock()
	return l, nil
}

// limitsOf reads limits from one DescribeInstanceTypes entry; max ENIs is
// the default network card's when EC2 lists cards.
func limitsOf(it types.InstanceTypeInfo) provider.Limits {
	ni := it.NetworkInfo
	l := provider.Limits{
		MaxENIs:    int(aws.ToInt32(ni.MaximumNetworkInterfaces)),
		IPv4PerENI: int(aws.ToInt32(ni.Ipv4AddressesPerInterface)),
		Hypervisor: string(it.Hypervisor),
		BareMetal:  aws.ToBool(it.BareMetal),
	}
	def := aws.ToInt32(ni.DefaultNetworkCardIndex)
	for _, card := range ni.NetworkCards {
		if aws.ToInt32(card.NetworkCardIndex) == def {
			l.MaxENIs = int(aws.ToInt32(card.MaximumNetworkInterfaces))
		}
	}
	l.PrefixDelegation = it.Hypervisor == types.InstanceTypeHypervisorNitro || l.BareMetal
	return l
}

// TableLimits returns the built-in limits of an instance type (the generated
// table of DescribeInstanceTypes figures), without calling EC2; ok is false
// for a type the table lacks. Offline tools (vpcipctl max-pods) use it.
func TableLimits(instanceType string) (l provider.Limits, ok bool) {
	l, ok = limitsTable[instanceType]
	return l, ok
}
