package poolsim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// Latencies are the cloud's response times on the virtual clock.
type Latencies struct {
	Assign    time.Duration // AssignPrivateIpAddresses until instance metadata shows the addresses (EC2: 0.3–0.5 s)
	Unassign  time.Duration // UnassignPrivateIpAddresses
	CreateENI time.Duration // CreateNetworkInterface + AttachNetworkInterface + ModifyNetworkInterfaceAttribute until metadata shows the ENI (EC2: about 4 s, up to 10 s)
	DeleteENI time.Duration // DetachNetworkInterface until detached, then DeleteNetworkInterface
	Describe  time.Duration // DescribeNetworkInterfaces
}

// DefaultLatencies are EC2's typical figures (reference-pool-algorithm.md,
// "EC2 latencies to model").
var DefaultLatencies = Latencies{
	Assign:    400 * time.Millisecond,
	Unassign:  300 * time.Millisecond,
	CreateENI: 4 * time.Second,
	DeleteENI: 2 * time.Second,
	Describe:  300 * time.Millisecond,
}

// InstanceType is an EC2 instance type's network limits and the pods its
// kubelet runs at most.
type InstanceType struct {
	Name    string
	Limits  provider.Limits
	MaxPods int // kubelet --max-pods: the EKS formula, capped at 110 below 30 vCPUs and at 250 above
}

// InstanceTypes are the simulated types, with EC2's limits
// (DescribeInstanceTypes: m5.large 3 × 10, m5.xlarge 4 × 15, m5.4xlarge
// 8 × 30, c5.18xlarge 15 × 50).
var InstanceTypes = []InstanceType{
	{"m5.large", provider.Limits{MaxENIs: 3, IPv4PerENI: 10, PrefixDelegation: true, Hypervisor: "nitro"}, 29},
	{"m5.xlarge", provider.Limits{MaxENIs: 4, IPv4PerENI: 15, PrefixDelegation: true, Hypervisor: "nitro"}, 58},
	{"m5.4xlarge", provider.Limits{MaxENIs: 8, IPv4PerENI: 30, PrefixDelegation: true, Hypervisor: "nitro"}, 110},
	{"c5.18xlarge", provider.Limits{MaxENIs: 15, IPv4PerENI: 50, PrefixDelegation: true, Hypervisor: "nitro"}, 250},
}

// Cloud is an in-memory EC2 for one instance: a provider.Provider whose
// calls take their Latencies on the Clock and obey the instance type's ENI
// and address limits. Addresses come from 10.0.0.0/8 and are never reused,
// /28 prefixes aligned. It counts mutating calls as EC2 would bill them
// against the account's rate limit: CreateENI is CreateNetworkInterface,
// AttachNetworkInterface and ModifyNetworkInterfaceAttribute (delete on
// termination), DeleteENI is DetachNetworkInterface and
// DeleteNetworkInterface.
type Cloud struct {
	clock *Clock
	typ   InstanceType
	lat   Latencies

	enis     []*provider.ENI // attached, by device number
	nextAddr uint32
	nextENI  int
	calls    map[string]int // EC2 operation → mutating calls
	onChange func()         // after every change of the addresses held
}

var _ provider.Provider = (*Cloud)(nil)

// NewCloud returns an instance of typ whose primary ENI holds no secondary
// address. onChange, when set, runs after every change of held addresses.
func NewCloud(clock *Clock, typ InstanceType, lat Latencies, onChange func()) *Cloud {
	c := &Cloud{clock: clock, typ: typ, lat: lat, nextAddr: 0x0a000010, calls: map[string]int{}, onChange: onChange}
	c.enis = []*provider.ENI{c.newENI(0)}
	return c
}

func (c *Cloud) newENI(dev int) *provider.ENI {
	c.nextENI++
	e := &provider.ENI{
		ID: fmt.Sprintf("eni-%017x", c.nextENI), MAC: fmt.Sprintf("02:00:00:00:%02x:%02x", c.nextENI>>8, c.nextENI&0xff),
		DeviceNumber: dev, SubnetID: "subnet-sim", SubnetCIDR: netip.MustParsePrefix("10.0.0.0/8"),
		Gateway: netip.MustParseAddr("10.0.0.1"), Attached: c.clock.Now(),
	}
	e.PrimaryIP = c.addr()
	return e
}

func (c *Cloud) addr() netip.Addr {
	a := c.nextAddr
	c.nextAddr++
	return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
}

func (c *Cloud) prefix() netip.Prefix {
	c.nextAddr = (c.nextAddr + 15) &^ 15
	p := netip.PrefixFrom(c.addr(), 28)
	c.nextAddr += 15
	return p
}

// Calls returns the mutating EC2 calls made so far, by operation, and their
// sum.
func (c *Cloud) Calls() (map[string]int, int) {
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return c.calls, n
}

// Held is the number of subnet addresses the instance holds beyond its
// own: secondary addresses, 16 per /28 prefix, and the primary address of
// every secondary ENI.
func (c *Cloud) Held() int {
	n := len(c.enis) - 1
	for _, e := range c.enis {
		n += len(e.SecondaryIPs) + 16*len(e.Prefixes)
	}
	return n
}

// ENICount is the number of attached ENIs.
func (c *Cloud) ENICount() int { return len(c.enis) }

func (c *Cloud) changed() {
	if c.onChange != nil {
		c.onChange()
	}
}

func (c *Cloud) find(id string) *provider.ENI {
	for _, e := range c.enis {
		if e.ID == id {
			return e
		}
	}
	return nil
}

func clone(e *provider.ENI) provider.ENI {
	out := *e
	out.SecondaryIPs = slices.Clone(e.SecondaryIPs)
	out.Prefixes = slices.Clone(e.Prefixes)
	return out
}

// Self describes the instance.
func (c *Cloud) Self(context.Context) (provider.Instance, error) {
	p := c.enis[0]
	return provider.Instance{
		ID: "i-0000000000000sim", Type: c.typ.Name, Region: "us-west-2", AvailabilityZone: "us-west-2a",
		VPCID: "vpc-sim", VPCCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		PrimaryENI: p.ID, PrimaryMAC: p.MAC, PrimaryIP: p.PrimaryIP, SubnetID: p.SubnetID,
	}, nil
}

// Limits returns the instance type's limits.
func (c *Cloud) Limits(context.Context, string) (provider.Limits, error) { return c.typ.Limits, nil }

// ENIs lists the attached ENIs (DescribeNetworkInterfaces).
func (c *Cloud) ENIs(context.Context) ([]provider.ENI, error) {
	c.clock.Sleep(c.lat.Describe)
	return c.MetadataENIs(context.Background())
}

// MetadataENIs lists the attached ENIs at once (metadata never lags here).
func (c *Cloud) MetadataENIs(context.Context) ([]provider.ENI, error) {
	out := make([]provider.ENI, 0, len(c.enis))
	for _, e := range c.enis {
		out = append(out, clone(e))
	}
	return out, nil
}

// CreateENI attaches a new ENI with its addresses or prefixes.
func (c *Cloud) CreateENI(_ context.Context, req provider.CreateENIRequest) (provider.ENI, error) {
	lim := c.typ.Limits
	n := max(req.Addresses, req.Prefixes)
	if n > lim.PodAddressesPerENI() {
		c.calls["CreateNetworkInterface"]++
		return provider.ENI{}, fmt.Errorf("CreateNetworkInterface with %d: %w", n, provider.ErrAddressLimit)
	}
	if len(c.enis) >= lim.MaxENIs {
		c.calls["CreateNetworkInterface"]++
		c.calls["AttachNetworkInterface"]++
		c.calls["DeleteNetworkInterface"]++
		return provider.ENI{}, fmt.Errorf("AttachNetworkInterface: %w", provider.ErrENILimit)
	}
	c.calls["CreateNetworkInterface"]++
	c.calls["AttachNetworkInterface"]++
	c.calls["ModifyNetworkInterfaceAttribute"]++
	c.clock.Sleep(c.lat.CreateENI)
	dev := 1
	for slices.ContainsFunc(c.enis, func(e *provider.ENI) bool { return e.DeviceNumber == dev }) {
		dev++
	}
	e := c.newENI(dev)
	for range req.Addresses {
		e.SecondaryIPs = append(e.SecondaryIPs, c.addr())
	}
	for range req.Prefixes {
		e.Prefixes = append(e.Prefixes, c.prefix())
	}
	c.enis = append(c.enis, e)
	slices.SortFunc(c.enis, func(a, b *provider.ENI) int { return a.DeviceNumber - b.DeviceNumber })
	c.changed()
	return clone(e), nil
}

// AssignAddresses adds n addresses or /28 prefixes to an ENI.
func (c *Cloud) AssignAddresses(_ context.Context, eniID string, n int, prefix bool) ([]netip.Prefix, error) {
	c.calls["AssignPrivateIpAddresses"]++
	e := c.find(eniID)
	if e == nil {
		return nil, fmt.Errorf("AssignPrivateIpAddresses on %s: %w", eniID, provider.ErrNotFound)
	}
	if n <= 0 || len(e.SecondaryIPs)+len(e.Prefixes)+n > c.typ.Limits.PodAddressesPerENI() {
		return nil, fmt.Errorf("AssignPrivateIpAddresses %d on %s: %w", n, eniID, provider.ErrAddressLimit)
	}
	c.clock.Sleep(c.lat.Assign)
	var out []netip.Prefix
	for range n {
		if prefix {
			p := c.prefix()
			e.Prefixes = append(e.Prefixes, p)
			out = append(out, p)
			continue
		}
		a := c.addr()
		e.SecondaryIPs = append(e.SecondaryIPs, a)
		out = append(out, netip.PrefixFrom(a, 32))
	}
	c.changed()
	return out, nil
}

// UnassignAddresses removes addresses and prefixes from an ENI.
func (c *Cloud) UnassignAddresses(_ context.Context, eniID string, addrs []netip.Prefix) error {
	c.calls["UnassignPrivateIpAddresses"]++
	c.clock.Sleep(c.lat.Unassign)
	e := c.find(eniID)
	if e == nil {
		return fmt.Errorf("UnassignPrivateIpAddresses on %s: %w", eniID, provider.ErrNotFound)
	}
	for _, p := range addrs {
		if p.Bits() == 32 {
			e.SecondaryIPs = slices.DeleteFunc(e.SecondaryIPs, func(a netip.Addr) bool { return a == p.Addr() })
		} else {
			e.Prefixes = slices.DeleteFunc(e.Prefixes, func(q netip.Prefix) bool { return q == p })
		}
	}
	c.changed()
	return nil
}

// DeleteENI detaches and deletes an ENI.
func (c *Cloud) DeleteENI(_ context.Context, eniID string) error {
	c.calls["DetachNetworkInterface"]++
	c.calls["DeleteNetworkInterface"]++
	c.clock.Sleep(c.lat.DeleteENI)
	c.enis = slices.DeleteFunc(c.enis, func(e *provider.ENI) bool { return e.ID == eniID && e.DeviceNumber != 0 })
	c.changed()
	return nil
}

// DeleteLeakedENIs finds nothing: the simulated instance leaks none.
func (c *Cloud) DeleteLeakedENIs(context.Context, time.Duration) ([]string, error) { return nil, nil }

// Subnets lists the instance's one subnet, with room to spare.
func (c *Cloud) Subnets(context.Context, provider.SubnetQuery) ([]provider.Subnet, error) {
	return []provider.Subnet{{ID: "subnet-sim", VPCID: "vpc-sim", Tags: map[string]string{}, CIDR: netip.MustParsePrefix("10.0.0.0/8"), AvailabilityZone: "us-west-2a", FreeAddresses: 1 << 20}}, nil
}

// AssignAddressesAt is not modeled: the simulated subnet is one instance's
// and never fragmented, so the pool lets it choose addresses.
func (c *Cloud) AssignAddressesAt(context.Context, string, []netip.Addr) ([]netip.Prefix, error) {
	return nil, fmt.Errorf("poolsim: naming addresses: %w", errors.ErrUnsupported)
}

// SubnetUsage is not modeled (see AssignAddressesAt).
func (c *Cloud) SubnetUsage(context.Context, string) ([]netip.Prefix, error) {
	return nil, fmt.Errorf("poolsim: listing the subnet: %w", errors.ErrUnsupported)
}
