package awsprovider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vpcip/vpcip/provider"
)

// identity is what the client needs to know about its own instance; it
// never changes while the instance runs.
type identity struct {
	instanceID     string
	instanceType   string
	primaryENI     string
	subnetID       string
	vpcID          string
	securityGroups []string
}

// metadata reads one IMDSv2 value under /latest/meta-data/ (IMDS GetMetadata)
// and returns it trimmed. A path IMDS does not serve (HTTP 404) returns
// ok false and no error. Like an EC2 attempt, the read (token, request and
// body) is bounded by Options.AttemptTimeout.
func (c *Client) metadata(ctx context.Context, path string) (value string, ok bool, err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	defer cancel()
	out, err := c.imds.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == 404 {
			c.opts.Observe("imds", "ok", time.Since(start))
			return "", false, nil
		}
		c.opts.Observe("imds", "error", time.Since(start))
		return "", false, fmt.Errorf("IMDS %s: %w", path, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(io.LimitReader(out.Content, 1<<20))
	if err != nil {
		c.opts.Observe("imds", "error", time.Since(start))
		return "", false, fmt.Errorf("IMDS %s: %w", path, err)
	}
	c.opts.Observe("imds", "ok", time.Since(start))
	return strings.TrimSpace(string(b)), true, nil
}

// mustMetadata is metadata for a path that IMDS always serves.
func (c *Client) mustMetadata(ctx context.Context, path string) (string, error) {
	v, ok, err := c.metadata(ctx, path)
	if err == nil && !ok {
		err = fmt.Errorf("IMDS %s: %w", path, provider.ErrNotFound)
	}
	return v, err
}

// Self describes this instance from IMDS (meta-data/instance-id,
// instance-type, placement/, mac and network/interfaces/macs/<mac>/...).
// It returns an error if IMDS cannot be read or a value does not parse.
func (c *Client) Self(ctx context.Context) (provider.Instance, error) {
	id, err := c.identity(ctx)
	if err != nil {
		return provider.Instance{}, err
	}
	inst := provider.Instance{ID: id.instanceID, Type: id.instanceType, PrimaryENI: id.primaryENI,
		SubnetID: id.subnetID, SecurityGroups: slices.Clone(id.securityGroups)}
	if inst.AvailabilityZone, err = c.mustMetadata(ctx, "placement/availability-zone"); err != nil {
		return provider.Instance{}, err
	}
	region, ok, err := c.metadata(ctx, "placement/region")
	if err != nil {
		return provider.Instance{}, err
	}
	if !ok && len(inst.AvailabilityZone) > 1 { // older IMDS: the zone is the region plus a letter
		region = inst.AvailabilityZone[:len(inst.AvailabilityZone)-1]
	}
	inst.Region = region
	if inst.PrimaryMAC, err = c.mustMetadata(ctx, "mac"); err != nil {
		return provider.Instance{}, err
	}
	eni, err := c.metadataENI(ctx, inst.PrimaryMAC)
	if err != nil {
		return provider.Instance{}, err
	}
	inst.PrimaryIP = eni.PrimaryIP
	macPath := "network/interfaces/macs/" + inst.PrimaryMAC + "/"
	if inst.VPCID, _, err = c.metadata(ctx, macPath+"vpc-id"); err != nil {
		return provider.Instance{}, err
	}
	cidrs, ok, err := c.metadata(ctx, macPath+"vpc-ipv4-cidr-blocks")
	if err == nil && !ok {
		cidrs, _, err = c.metadata(ctx, macPath+"vpc-ipv4-cidr-block")
	}
	if err != nil {
		return provider.Instance{}, err
	}
	if inst.VPCCIDRs, err = parsePrefixes(cidrs); err != nil {
		return provider.Instance{}, fmt.Errorf("IMDS %svpc-ipv4-cidr-blocks: %w", macPath, err)
	}
	if err := c.selfIPv6(ctx, &inst, macPath); err != nil {
		return provider.Instance{}, err
	}
	return inst, nil
}

// selfIPv6 fills the instance's IPv6 CIDRs from IMDS (subnet-ipv6-cidr-blocks
// and vpc-ipv6-cidr-blocks of the primary MAC); both are absent where the
// subnet or VPC has no IPv6 CIDR block. A subnet has at most one.
func (c *Client) selfIPv6(ctx context.Context, inst *provider.Instance, macPath string) error {
	subnet, _, err := c.metadata(ctx, macPath+"subnet-ipv6-cidr-blocks")
	if err != nil {
		return err
	}
	subnets, err := parsePrefixes(subnet)
	if err != nil {
		return fmt.Errorf("IMDS %ssubnet-ipv6-cidr-blocks: %w", macPath, err)
	}
	if len(subnets) > 0 {
		inst.SubnetIPv6CIDR = subnets[0]
	}
	vpc, _, err := c.metadata(ctx, macPath+"vpc-ipv6-cidr-blocks")
	if err != nil {
		return err
	}
	if inst.VPCIPv6CIDRs, err = parsePrefixes(vpc); err != nil {
		return fmt.Errorf("IMDS %svpc-ipv6-cidr-blocks: %w", macPath, err)
	}
	return nil
}

// identity returns the instance's identity, read from IMDS once.
func (c *Client) identity(ctx context.Context) (identity, error) {
	c.selfMu.Lock()
	defer c.selfMu.Unlock()
	if c.self != nil {
		return *c.self, nil
	}
	var id identity
	var err error
	if id.instanceID, err = c.mustMetadata(ctx, "instance-id"); err != nil {
		return id, err
	}
	if id.instanceType, err = c.mustMetadata(ctx, "instance-type"); err != nil {
		return id, err
	}
	mac, err := c.mustMetadata(ctx, "mac")
	if err != nil {
		return id, err
	}
	eni, err := c.metadataENI(ctx, mac)
	if err != nil {
		return id, err
	}
	id.primaryENI, id.subnetID, id.securityGroups = eni.ID, eni.SubnetID, eni.SecurityGroups
	if id.vpcID, _, err = c.metadata(ctx, "network/interfaces/macs/"+mac+"/vpc-id"); err != nil {
		return id, err
	}
	c.self = &id
	return id, nil
}

// metadataMACs lists the MACs of the instance's ENIs
// (meta-data/network/interfaces/macs/).
func (c *Client) metadataMACs(ctx context.Context) ([]string, error) {
	list, err := c.mustMetadata(ctx, "network/interfaces/macs/")
	if err != nil {
		return nil, err
	}
	var macs []string
	for _, line := range strings.Fields(list) {
		if mac := strings.TrimSuffix(line, "/"); mac != "" {
			macs = append(macs, strings.ToLower(mac))
		}
	}
	return macs, nil
}

// metadataENI reads one ENI from meta-data/network/interfaces/macs/<mac>/.
// Tags and attach time are not in IMDS and stay empty.
func (c *Client) metadataENI(ctx context.Context, mac string) (provider.ENI, error) {
	p := "network/interfaces/macs/" + mac + "/"
	eni := provider.ENI{MAC: mac}
	var err error
	get := func(key string, required bool) string {
		if err != nil {
			return ""
		}
		var v string
		var ok bool
		v, ok, err = c.metadata(ctx, p+key)
		if err == nil && !ok && required {
			err = fmt.Errorf("IMDS %s%s: %w", p, key, provider.ErrNotFound)
		}
		return v
	}
	eni.ID = get("interface-id", true)
	dev := get("device-number", true)
	card := get("network-card", false)
	if _, cerr := strconv.Atoi(card); cerr != nil {
		// Older metadata servers (and AWS's IMDS simulator) call it
		// network-card-index, and may answer network-card with a listing.
		card = get("network-card-index", false)
	}
	ips := get("local-ipv4s", true)
	prefixes := get("ipv4-prefix", false)
	v6Prefixes := get("ipv6-prefix", false)
	eni.SubnetID = get("subnet-id", true)
	subnet := get("subnet-ipv4-cidr-block", true)
	eni.SecurityGroups = strings.Fields(get("security-group-ids", false))
	if err != nil {
		return provider.ENI{}, err
	}
	if err := parseMetadataENI(&eni, dev, card, ips, prefixes, subnet); err != nil {
		return provider.ENI{}, fmt.Errorf("IMDS %s: %w", p, err)
	}
	if eni.IPv6Prefixes, err = parsePrefixes(v6Prefixes); err != nil {
		return provider.ENI{}, fmt.Errorf("IMDS %sipv6-prefix: %w", p, err)
	}
	return eni, nil
}

// parseMetadataENI fills eni from IMDS's text values. local-ipv4s lists the
// primary address first.
func parseMetadataENI(eni *provider.ENI, dev, card, ips, prefixes, subnet string) error {
	var err error
	if eni.DeviceNumber, err = strconv.Atoi(dev); err != nil {
		return fmt.Errorf("device-number %q: %w", dev, err)
	}
	if card != "" {
		if eni.NetworkCard, err = strconv.Atoi(card); err != nil {
			return fmt.Errorf("network-card %q: %w", card, err)
		}
	}
	addrs, err := parseAddrs(ips)
	if err != nil {
		return fmt.Errorf("local-ipv4s: %w", err)
	}
	if len(addrs) == 0 {
		return errors.New("local-ipv4s is empty")
	}
	eni.PrimaryIP, eni.SecondaryIPs = addrs[0], addrs[1:]
	slices.SortFunc(eni.SecondaryIPs, netip.Addr.Compare)
	if eni.Prefixes, err = parsePrefixes(prefixes); err != nil {
		return fmt.Errorf("ipv4-prefix: %w", err)
	}
	if eni.SubnetCIDR, err = netip.ParsePrefix(subnet); err != nil {
		return fmt.Errorf("subnet-ipv4-cidr-block: %w", err)
	}
	eni.Gateway = gateway(eni.SubnetCIDR)
	return nil
}

// MetadataENIs lists the instance's ENIs on network card 0 from IMDS, merged
// with what EC2 has told this client (see the package doc): addresses IMDS
// has not shown yet are absent, addresses IMDS once showed stay until EC2
// says they are gone, and ENIs and addresses EC2 says are gone are absent even
// while IMDS still lists them. Sorted by device number. Tags and Attached are
// empty. Errors come from IMDS only.
func (c *Client) MetadataENIs(ctx context.Context) ([]provider.ENI, error) {
	macs, err := c.metadataMACs(ctx)
	if err != nil {
		return nil, err
	}
	var seen []provider.ENI
	for _, mac := range macs {
		eni, err := c.metadataENI(ctx, mac)
		if err != nil {
			return nil, err
		}
		if eni.NetworkCard == 0 {
			seen = append(seen, eni)
		}
	}
	return c.meta.merge(seen, time.Now()), nil
}

// metadataAddrs reads, for the ENI at mac, its id and the addresses
// (local-ipv4s, the primary included, as /32s) and prefixes (ipv4-prefix)
// IMDS lists; ok is false when IMDS does not list the MAC.
func (c *Client) metadataAddrs(ctx context.Context, mac string) (eniID string, listed map[netip.Prefix]bool, ok bool, err error) {
	p := "network/interfaces/macs/" + mac + "/"
	eniID, ok, err = c.metadata(ctx, p+"interface-id")
	if err != nil || !ok {
		return "", nil, false, err
	}
	ips, _, err := c.metadata(ctx, p+"local-ipv4s")
	if err != nil {
		return "", nil, false, err
	}
	prefixes, _, err := c.metadata(ctx, p+"ipv4-prefix")
	if err != nil {
		return "", nil, false, err
	}
	addrs, err := parseAddrs(ips)
	if err != nil {
		return "", nil, false, fmt.Errorf("IMDS %slocal-ipv4s: %w", p, err)
	}
	pfxs, err := parsePrefixes(prefixes)
	if err != nil {
		return "", nil, false, fmt.Errorf("IMDS %sipv4-prefix: %w", p, err)
	}
	listed = make(map[netip.Prefix]bool, len(addrs)+len(pfxs))
	for _, a := range addrs {
		listed[netip.PrefixFrom(a, 32)] = true
	}
	for _, pfx := range pfxs {
		listed[pfx] = true
	}
	return eniID, listed, true, nil
}

// waitMetadata polls IMDS, with doubling intervals, until the ENI at mac is
// eniID and lists every one of want, for at most Options.MetadataWait. It
// returns what IMDS lists, or an error wrapping provider.ErrNotVisible when
// the bound passes. A failed IMDS read (a timeout on a loaded host) counts
// as "not shown yet": the change was made, so a caller must learn that it
// stands (ErrNotVisible), not that it failed.
func (c *Client) waitMetadata(ctx context.Context, mac, eniID string, want []netip.Prefix) (map[netip.Prefix]bool, error) {
	deadline := time.Now().Add(c.opts.MetadataWait)
	poll := c.opts.MetadataPoll
	for {
		id, listed, ok, err := c.metadataAddrs(ctx, mac)
		if err == nil && ok && id == eniID && !slices.ContainsFunc(want, func(p netip.Prefix) bool { return !listed[p] }) {
			return listed, nil
		}
		left := time.Until(deadline)
		if ctx.Err() != nil || left <= 0 {
			notShown := fmt.Errorf("IMDS does not show %d addresses on %s (%s) after %s: %w",
				len(want), eniID, mac, c.opts.MetadataWait-left.Round(time.Millisecond), provider.ErrNotVisible)
			return nil, errors.Join(notShown, err, ctx.Err())
		}
		if err := provider.Sleep(ctx, min(poll, left)); err != nil {
			return nil, fmt.Errorf("IMDS does not show %d addresses on %s (%s) yet: %w: %w", len(want), eniID, mac, err, provider.ErrNotVisible)
		}
		poll = min(2*poll, time.Second)
	}
}

// recordVisible tells the ledger what IMDS lists for an ENI, reading the
// whole ENI from IMDS when the ledger does not know it yet.
func (c *Client) recordVisible(ctx context.Context, mac, eniID string, listed map[netip.Prefix]bool) error {
	if c.meta.showAddrs(eniID, listed, time.Now()) {
		return nil
	}
	eni, err := c.metadataENI(ctx, mac)
	if err != nil {
		return err
	}
	if eni.ID == eniID {
		c.meta.visible(eni, time.Now())
	}
	return nil
}

// macOf finds the MAC of an attached ENI in IMDS.
func (c *Client) macOf(ctx context.Context, eniID string) (string, error) {
	if mac, ok := c.meta.mac(eniID); ok {
		return mac, nil
	}
	macs, err := c.metadataMACs(ctx)
	if err != nil {
		return "", err
	}
	for _, mac := range macs {
		id, _, err := c.metadata(ctx, "network/interfaces/macs/"+mac+"/interface-id")
		if err != nil {
			return "", err
		}
		if id == eniID {
			return mac, nil
		}
	}
	return "", fmt.Errorf("IMDS lists no ENI %s: %w", eniID, provider.ErrNotFound)
}

func parseAddrs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Fields(s) {
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Fields(s) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, comparePrefix)
	return out, nil
}

// gateway is the subnet's router address: its first address plus one
// (EC2 reserves the network address and the next one for the VPC router).
func gateway(subnet netip.Prefix) netip.Addr {
	if !subnet.IsValid() {
		return netip.Addr{}
	}
	return subnet.Masked().Addr().Next()
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// addressSet is the ENI's secondary addresses (as /32) and prefixes.
func addressSet(eni provider.ENI) map[netip.Prefix]bool {
	set := make(map[netip.Prefix]bool, len(eni.SecondaryIPs)+len(eni.Prefixes))
	for _, a := range eni.SecondaryIPs {
		set[netip.PrefixFrom(a, 32)] = true
	}
	for _, p := range eni.Prefixes {
		set[p] = true
	}
	return set
}
