package awsprovider

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/provider"
)

// ENIs lists the ENIs attached to this instance on network card 0, sorted by
// device number, from EC2 DescribeNetworkInterfaces (filter
// attachment.instance-id, every page) and, for subnet CIDRs not yet cached,
// one EC2 DescribeSubnets. Its answer is authoritative: MetadataENIs stops
// reporting what it lacks. An ENI of this cluster (TagCluster) attached
// without delete-on-termination, as a daemon killed between
// AttachNetworkInterface and ModifyNetworkInterfaceAttribute leaves it, gets
// it set (one EC2 ModifyNetworkInterfaceAttribute each; a failure is retried
// at the next read), so it goes with the instance instead of leaking.
func (c *Client) ENIs(ctx context.Context) ([]provider.ENI, error) {
	id, err := c.identity(ctx)
	if err != nil {
		return nil, err
	}
	asOf := time.Now()
	nis, err := c.describeENIs(ctx, []types.Filter{filter("attachment.instance-id", id.instanceID)})
	if err != nil {
		return nil, err
	}
	c.fixDeleteOnTermination(provider.WithoutDeferral(ctx), nis)
	enis, err := c.convertENIs(ctx, nis)
	if err != nil {
		return nil, err
	}
	out := enis[:0]
	for _, eni := range enis {
		if eni.NetworkCard == 0 {
			out = append(out, eni)
		}
	}
	slices.SortFunc(out, func(a, b provider.ENI) int { return a.DeviceNumber - b.DeviceNumber })
	c.meta.snapshot(out, asOf)
	return out, nil
}

// fixDeleteOnTermination sets delete-on-termination on the attached
// secondary ENIs of this cluster that lack it (see ENIs). Its failures are
// dropped, so ctx must not carry provider.WithDeferral: a deferred change
// would be skipped with its place held (ENIs under the pool's growth, when
// it confirms a stale view with EC2).
func (c *Client) fixDeleteOnTermination(ctx context.Context, nis []types.NetworkInterface) {
	for _, ni := range nis {
		att := ni.Attachment
		if att == nil || aws.ToInt32(att.DeviceIndex) == 0 || aws.ToBool(att.DeleteOnTermination) || !c.ours(ni) {
			continue
		}
		_, _ = call(ctx, c, actModifyNetworkInterface, func(ctx context.Context) (*ec2.ModifyNetworkInterfaceAttributeOutput, error) {
			return c.ec2.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
				NetworkInterfaceId: ni.NetworkInterfaceId,
				Attachment: &types.NetworkInterfaceAttachmentChanges{
					AttachmentId: att.AttachmentId, DeleteOnTermination: aws.Bool(true)},
			})
		})
	}
}

// ours reports whether ni carries this cluster's TagCluster.
func (c *Client) ours(ni types.NetworkInterface) bool {
	for _, t := range ni.TagSet {
		if aws.ToString(t.Key) == TagCluster && aws.ToString(t.Value) == c.opts.ClusterName {
			return true
		}
	}
	return false
}

// describeENIs runs EC2 DescribeNetworkInterfaces with filters over every
// page (Options.PageSize per page), each page paced and retried on its own.
func (c *Client) describeENIs(ctx context.Context, filters []types.Filter) ([]types.NetworkInterface, error) {
	var all []types.NetworkInterface
	var token *string
	for {
		in := &ec2.DescribeNetworkInterfacesInput{Filters: filters, MaxResults: aws.Int32(c.opts.PageSize), NextToken: token}
		out, err := call(ctx, c, actDescribeNetworkInterfaces, func(ctx context.Context) (*ec2.DescribeNetworkInterfacesOutput, error) {
			return c.ec2.DescribeNetworkInterfaces(ctx, in)
		})
		if err != nil {
			return nil, err
		}
		all = append(all, out.NetworkInterfaces...)
		if aws.ToString(out.NextToken) == "" {
			return all, nil
		}
		token = out.NextToken
	}
}

// describeENI describes one ENI by id; an ENI that does not exist returns an
// error wrapping provider.ErrNotFound.
func (c *Client) describeENI(ctx context.Context, eniID string) (types.NetworkInterface, error) {
	out, err := call(ctx, c, actDescribeNetworkInterfaces, func(ctx context.Context) (*ec2.DescribeNetworkInterfacesOutput, error) {
		return c.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eniID}})
	})
	if err != nil {
		return types.NetworkInterface{}, err
	}
	if len(out.NetworkInterfaces) != 1 {
		return types.NetworkInterface{}, fmt.Errorf("EC2 DescribeNetworkInterfaces: %s: %w", eniID, provider.ErrNotFound)
	}
	return out.NetworkInterfaces[0], nil
}

func filter(name string, values ...string) types.Filter {
	return types.Filter{Name: aws.String(name), Values: values}
}

// convertENIs turns EC2's ENIs into ours, looking up subnet CIDRs.
func (c *Client) convertENIs(ctx context.Context, nis []types.NetworkInterface) ([]provider.ENI, error) {
	ids := make([]string, 0, len(nis))
	for _, ni := range nis {
		ids = append(ids, aws.ToString(ni.SubnetId))
	}
	cidrs, err := c.subnetCIDRs(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]provider.ENI, 0, len(nis))
	for _, ni := range nis {
		eni, err := convertENI(ni, cidrs[aws.ToString(ni.SubnetId)])
		if err != nil {
			return nil, err
		}
		out = append(out, eni)
	}
	return out, nil
}

// convertENI turns one EC2 NetworkInterface into a provider.ENI.
func convertENI(ni types.NetworkInterface, subnet netip.Prefix) (provider.ENI, error) {
	eni := provider.ENI{
		ID:         aws.ToString(ni.NetworkInterfaceId),
		MAC:        strings.ToLower(aws.ToString(ni.MacAddress)),
		SubnetID:   aws.ToString(ni.SubnetId),
		SubnetCIDR: subnet,
		Gateway:    gateway(subnet),
		Tags:       map[string]string{},
	}
	bad := func(what, v string, err error) error {
		return fmt.Errorf("EC2 reports ENI %s with %s %q: %w", eni.ID, what, v, err)
	}
	if a := ni.Attachment; a != nil {
		eni.DeviceNumber = int(aws.ToInt32(a.DeviceIndex))
		eni.NetworkCard = int(aws.ToInt32(a.NetworkCardIndex))
		eni.Attached = aws.ToTime(a.AttachTime)
	}
	var err error
	if eni.PrimaryIP, err = netip.ParseAddr(aws.ToString(ni.PrivateIpAddress)); err != nil {
		return eni, bad("primary address", aws.ToString(ni.PrivateIpAddress), err)
	}
	for _, pa := range ni.PrivateIpAddresses {
		a, err := netip.ParseAddr(aws.ToString(pa.PrivateIpAddress))
		if err != nil {
			return eni, bad("address", aws.ToString(pa.PrivateIpAddress), err)
		}
		if !aws.ToBool(pa.Primary) && a != eni.PrimaryIP {
			eni.SecondaryIPs = append(eni.SecondaryIPs, a)
		}
	}
	slices.SortFunc(eni.SecondaryIPs, netip.Addr.Compare)
	for _, p := range ni.Ipv4Prefixes {
		pfx, err := netip.ParsePrefix(aws.ToString(p.Ipv4Prefix))
		if err != nil {
			return eni, bad("prefix", aws.ToString(p.Ipv4Prefix), err)
		}
		eni.Prefixes = append(eni.Prefixes, pfx.Masked())
	}
	slices.SortFunc(eni.Prefixes, comparePrefix)
	for _, p := range ni.Ipv6Prefixes {
		pfx, err := netip.ParsePrefix(aws.ToString(p.Ipv6Prefix))
		if err != nil || !pfx.Addr().Is6() {
			return eni, bad("IPv6 prefix", aws.ToString(p.Ipv6Prefix), err)
		}
		eni.IPv6Prefixes = append(eni.IPv6Prefixes, pfx.Masked())
	}
	slices.SortFunc(eni.IPv6Prefixes, comparePrefix)
	for _, g := range ni.Groups {
		eni.SecurityGroups = append(eni.SecurityGroups, aws.ToString(g.GroupId))
	}
	for _, t := range ni.TagSet {
		eni.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return eni, nil
}

// subnetCIDRs returns the IPv4 CIDR of each subnet, asking EC2
// DescribeSubnets once for those not cached. A subnet's CIDR never changes.
func (c *Client) subnetCIDRs(ctx context.Context, ids []string) (map[string]netip.Prefix, error) {
	c.cacheMu.Lock()
	out := map[string]netip.Prefix{}
	var missing []string
	for _, id := range ids {
		if p, ok := c.subnets[id]; ok {
			out[id] = p
		} else if id != "" && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	c.cacheMu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	resp, err := call(ctx, c, actDescribeSubnets, func(ctx context.Context) (*ec2.DescribeSubnetsOutput, error) {
		return c.ec2.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: missing})
	})
	if err != nil {
		return nil, err
	}
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	for _, s := range resp.Subnets {
		p, err := netip.ParsePrefix(aws.ToString(s.CidrBlock))
		if err != nil {
			return nil, fmt.Errorf("EC2 reports subnet %s with CIDR %q: %w", aws.ToString(s.SubnetId), aws.ToString(s.CidrBlock), err)
		}
		c.subnets[aws.ToString(s.SubnetId)] = p.Masked()
		out[aws.ToString(s.SubnetId)] = p.Masked()
	}
	return out, nil
}

// CreateENI creates an ENI in req.SubnetID (default: the primary ENI's) with
// req.Addresses secondary addresses or req.Prefixes /28 prefixes (EC2
// CreateNetworkInterface with SecondaryPrivateIpAddressCount or
// Ipv4PrefixCount, a ClientToken and the TagInstanceID, TagCluster, TagNode
// and TagCreatedAt tags over req.Tags), attaches it at the lowest free device
// number on network card 0 (EC2 DescribeNetworkInterfaces,
// AttachNetworkInterface), sets delete-on-termination (EC2
// ModifyNetworkInterfaceAttribute), and waits until IMDS shows it with all
// its addresses. A failed attach or attribute change deletes the new ENI
// (DeleteENI) and returns the failure: provider.ErrENILimit when the instance
// has no free slot. Creation fails with provider.ErrSubnetFull,
// ErrInsufficientCIDR, ErrAddressLimit, ErrNotFound (no such subnet), or
// ErrUnauthorized as EC2 refuses it. When IMDS does not show the attached
// ENI within Options.MetadataWait, the ENI is returned with an error wrapping
// provider.ErrNotVisible (also when IMDS cannot be read then: the ENI is
// attached either way). Concurrent calls are serialized, so that each
// takes its own device number.
func (c *Client) CreateENI(ctx context.Context, req provider.CreateENIRequest) (provider.ENI, error) {
	if req.Addresses < 0 || req.Prefixes < 0 || (req.Addresses > 0 && req.Prefixes > 0) {
		return provider.ENI{}, fmt.Errorf("CreateENI: want addresses or prefixes, not both and not negative (got %d, %d)", req.Addresses, req.Prefixes)
	}
	id, err := c.identity(ctx)
	if err != nil {
		return provider.ENI{}, err
	}
	c.createMu.Lock()
	defer c.createMu.Unlock()
	ctx, endChain := withChain(ctx, actCreateNetworkInterface, actAttachNetworkInterface, actModifyNetworkInterface)
	defer endChain()
	ni, err := c.createENI(ctx, id, req)
	if err != nil {
		return provider.ENI{}, err
	}
	eniID := aws.ToString(ni.NetworkInterfaceId)
	ctx = finishing(ctx)
	// The device number is read after the create, so that a create the
	// fleet's budget refuses (nothing sent, tried again soon) costs no
	// describe: in a launch of 200 nodes those describes were most of the
	// fleet's EC2 requests.
	dev, err := c.nextDeviceIndex(ctx, id.instanceID)
	if err != nil {
		return provider.ENI{}, c.rollback(ctx, eniID, err)
	}
	att, err := call(ctx, c, actAttachNetworkInterface, func(ctx context.Context) (*ec2.AttachNetworkInterfaceOutput, error) {
		return c.ec2.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
			InstanceId: aws.String(id.instanceID), NetworkInterfaceId: aws.String(eniID),
			DeviceIndex: aws.Int32(int32(dev)), NetworkCardIndex: aws.Int32(0),
		})
	})
	if err == nil {
		_, err = call(ctx, c, actModifyNetworkInterface, func(ctx context.Context) (*ec2.ModifyNetworkInterfaceAttributeOutput, error) {
			return c.ec2.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
				NetworkInterfaceId: aws.String(eniID),
				Attachment: &types.NetworkInterfaceAttachmentChanges{
					AttachmentId: att.AttachmentId, DeleteOnTermination: aws.Bool(true)},
			})
		})
	}
	if err != nil {
		return provider.ENI{}, c.rollback(ctx, eniID, err)
	}
	return c.finishCreate(ctx, ni, dev)
}

// createENI is the EC2 CreateNetworkInterface step of CreateENI.
func (c *Client) createENI(ctx context.Context, id identity, req provider.CreateENIRequest) (*types.NetworkInterface, error) {
	subnet, groups := req.SubnetID, req.SecurityGroups
	if subnet == "" {
		subnet = id.subnetID
	}
	if len(groups) == 0 {
		groups = id.securityGroups
	}
	tags := maps.Clone(req.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	tags[TagInstanceID] = id.instanceID
	tags[TagCluster] = c.opts.ClusterName
	tags[TagCreatedAt] = time.Now().UTC().Format(time.RFC3339)
	if c.opts.NodeName != "" {
		tags[TagNode] = c.opts.NodeName
	}
	in := &ec2.CreateNetworkInterfaceInput{
		SubnetId:          aws.String(subnet),
		Groups:            groups,
		Description:       aws.String("vpcip pod ENI of " + id.instanceID),
		ClientToken:       aws.String(clientToken()),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: ec2Tags(tags)}},
	}
	if req.Addresses > 0 {
		in.SecondaryPrivateIpAddressCount = aws.Int32(int32(req.Addresses))
	}
	if req.Prefixes > 0 {
		in.Ipv4PrefixCount = aws.Int32(int32(req.Prefixes))
	}
	out, err := call(ctx, c, actCreateNetworkInterface, func(ctx context.Context) (*ec2.CreateNetworkInterfaceOutput, error) {
		return c.ec2.CreateNetworkInterface(ctx, in)
	})
	if err != nil {
		return nil, err
	}
	if out.NetworkInterface == nil || aws.ToString(out.NetworkInterface.NetworkInterfaceId) == "" {
		return nil, errors.New("EC2 CreateNetworkInterface returned no ENI")
	}
	return out.NetworkInterface, nil
}

// finishCreate waits for IMDS to show the attached ENI and returns it.
func (c *Client) finishCreate(ctx context.Context, ni *types.NetworkInterface, dev int) (provider.ENI, error) {
	cidrs, err := c.subnetCIDRs(ctx, []string{aws.ToString(ni.SubnetId)})
	if err != nil {
		cidrs = nil // the subnet CIDR also comes from IMDS below
	}
	eni, err := convertENI(*ni, cidrs[aws.ToString(ni.SubnetId)])
	if err != nil {
		return provider.ENI{}, err
	}
	eni.DeviceNumber, eni.NetworkCard, eni.Attached = dev, 0, time.Now()
	want := slices.Collect(maps.Keys(addressSet(eni)))
	want = append(want, netip.PrefixFrom(eni.PrimaryIP, 32))
	if _, err := c.waitMetadata(ctx, eni.MAC, eni.ID, want); err != nil {
		return eni, fmt.Errorf("CreateENI: %s is attached: %w", eni.ID, err)
	}
	shown, err := c.metadataENI(ctx, eni.MAC)
	if err != nil {
		return eni, fmt.Errorf("CreateENI: %s is attached, its metadata unreadable (%w): %w", eni.ID, err, provider.ErrNotVisible)
	}
	if !eni.SubnetCIDR.IsValid() {
		eni.SubnetCIDR, eni.Gateway = shown.SubnetCIDR, shown.Gateway
	}
	c.meta.visible(shown, time.Now())
	return eni, nil
}

// rollback deletes an ENI whose attach failed, even if ctx has ended, and
// returns cause joined with any failure to delete.
func (c *Client) rollback(ctx context.Context, eniID string, cause error) error {
	c.log.Debug("deleting ENI after failed attach", "eni", eniID, "err", cause)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.DetachWait+30*time.Second)
	defer cancel()
	if err := c.DeleteENI(ctx, eniID); err != nil {
		c.log.Warn("could not delete ENI after failed attach; DeleteLeakedENIs will", "eni", eniID, "err", err)
		return errors.Join(cause, fmt.Errorf("deleting %s after the failed attach: %w", eniID, err))
	}
	return cause
}

// nextDeviceIndex is the lowest device index ≥ 1 not used by an attachment
// of the instance (EC2 DescribeNetworkInterfaces).
func (c *Client) nextDeviceIndex(ctx context.Context, instanceID string) (int, error) {
	nis, err := c.describeENIs(ctx, []types.Filter{filter("attachment.instance-id", instanceID)})
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	for _, ni := range nis {
		if a := ni.Attachment; a != nil && aws.ToInt32(a.NetworkCardIndex) == 0 {
			used[int(aws.ToInt32(a.DeviceIndex))] = true
		}
	}
	dev := 1
	for used[dev] {
		dev++
	}
	return dev, nil
}

func ec2Tags(m map[string]string) []types.Tag {
	tags := make([]types.Tag, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(m[k])})
	}
	return tags
}

// clientToken is a fresh idempotency token for EC2 (at most 64 ASCII
// characters).
func clientToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "vpcip-" + hex.EncodeToString(b[:])
}
