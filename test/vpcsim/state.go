package vpcsim

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// LaunchInstance starts a running instance of the given EC2 instance type in
// the subnet (subnetID "" = the first subnet), with its primary ENI attached
// at device 0, network card 0, delete-on-termination set. It returns an
// *Error (InvalidParameterValue for an unknown type, InvalidSubnetID.NotFound,
// InsufficientFreeAddressesInSubnet).
func (c *Cloud) LaunchInstance(instanceType, subnetID string) (InstanceInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	inst, err := c.launchLocked(instanceType, subnetID)
	if err != nil {
		return InstanceInfo{}, err
	}
	c.recordENIsLocked()
	return c.instanceInfoLocked(inst), nil
}

// TerminateInstance terminates the instance as EC2 TerminateInstances does.
// It returns an *Error (InvalidInstanceID.NotFound).
func (c *Cloud) TerminateInstance(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.terminateLocked(id); err != nil {
		return err
	}
	c.recordENIsLocked()
	return nil
}

// Instance returns a copy of the instance's model state.
func (c *Cloud) Instance(id string) (InstanceInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	inst, ok := c.instances[id]
	if !ok {
		return InstanceInfo{}, false
	}
	return c.instanceInfoLocked(inst), true
}

// Instances returns copies of every instance, terminated ones included, by id.
func (c *Cloud) Instances() []InstanceInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]InstanceInfo, 0, len(c.instances))
	for _, inst := range c.instances {
		out = append(out, c.instanceInfoLocked(inst))
	}
	slices.SortFunc(out, func(a, b InstanceInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// NetworkInterface returns a copy of the ENI's model state.
func (c *Cloud) NetworkInterface(id string) (ENIInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.enis[id]
	if !ok {
		return ENIInfo{}, false
	}
	return c.eniInfoLocked(e), true
}

// NetworkInterfaces returns copies of every ENI, by id.
func (c *Cloud) NetworkInterfaces() []ENIInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ENIInfo, 0, len(c.enis))
	for _, id := range c.sortedENIIDsLocked() {
		out = append(out, c.eniInfoLocked(c.enis[id]))
	}
	return out
}

// Subnet returns a copy of the subnet's model state, with its free address count.
func (c *Cloud) Subnet(id string) (SubnetInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.subnets[id]
	if !ok {
		return SubnetInfo{}, false
	}
	return subnetInfo(s), true
}

// Subnets returns copies of every subnet in creation order.
func (c *Cloud) Subnets() []SubnetInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]SubnetInfo, 0, len(c.subnetIDs))
	for _, id := range c.subnetIDs {
		out = append(out, subnetInfo(c.subnets[id]))
	}
	return out
}

// SecurityGroupInfo is a copy of one security group.
type SecurityGroupInfo struct {
	ID, Name, Description string
	Tags                  map[string]string
}

// SecurityGroups returns copies of every security group of the VPC, by id.
func (c *Cloud) SecurityGroups() []SecurityGroupInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]SecurityGroupInfo, 0, len(c.groups))
	for _, g := range c.groups {
		out = append(out, SecurityGroupInfo{ID: g.id, Name: g.name, Description: g.description, Tags: copyTags(g.tags)})
	}
	slices.SortFunc(out, func(a, b SecurityGroupInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// HoldAddresses marks n free addresses of the subnet as used by something
// outside the simulation (another team's instances, load balancers), lowest
// first, as a subnet that is filling up looks to EC2: they count against
// AvailableIpAddressCount and are never handed out. It returns the
// addresses, or an *Error (InvalidSubnetID.NotFound,
// InsufficientFreeAddressesInSubnet when fewer than n are free; then
// nothing is held).
func (c *Cloud) HoldAddresses(subnetID string, n int) ([]netip.Addr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.subnets[subnetID]
	if !ok {
		return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", subnetID)
	}
	if n < 0 {
		return nil, errorf("InvalidParameterValue", "Invalid address count %d", n)
	}
	a := s.takeAddrs(n)
	if a == nil && n > 0 {
		return nil, errSubnetFull(s.id)
	}
	return a, nil
}

// InstanceByAddress returns the running instance whose ENI holds a as its
// primary address, or as its primary IPv6 address (the ENI's first IPv6
// address): how IMDS identifies a caller by source address.
func (c *Cloud) InstanceByAddress(a netip.Addr) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.enis {
		primary := e.primary == a || len(e.ipv6) > 0 && e.ipv6[0] == a
		if primary && e.inst != nil && e.inst.state == "running" {
			return e.inst.id, true
		}
	}
	return "", false
}

func subnetInfo(s *subnet) SubnetInfo {
	return SubnetInfo{ID: s.id, CIDR: s.cidr, AvailabilityZone: s.az, FreeAddresses: s.free, FreePrefixes: s.freeBlocks(), IPv6CIDR: s.ipv6CIDR(), Tags: copyTags(s.tags)}
}

func (c *Cloud) instanceInfoLocked(inst *instance) InstanceInfo {
	info := InstanceInfo{ID: inst.id, Type: inst.typ, AvailabilityZone: inst.az, SubnetID: inst.subnetID, State: inst.state}
	for _, e := range inst.enis {
		if e.deviceIndex == 0 {
			info.PrimaryENI = c.eniInfoLocked(e)
		}
	}
	return info
}

func (c *Cloud) eniInfoLocked(e *eni) ENIInfo {
	s := c.subnets[e.subnetID]
	info := ENIInfo{
		ID: e.id, MAC: e.mac, SubnetID: e.subnetID, Description: e.description,
		Status:        "available",
		PrimaryIP:     e.primary,
		SecondaryIPs:  slices.Clone(e.secondaries),
		Prefixes:      slices.Clone(e.prefixes),
		IPv6Addresses: slices.Clone(e.ipv6),
		IPv6Prefixes:  slices.Clone(e.ipv6Prefixes),
		SubnetCIDR:    s.cidr, Gateway: s.gateway(), SubnetIPv6CIDR: s.ipv6CIDR(),
		Tags:           copyTags(e.tags),
		SecurityGroups: slices.Clone(e.groups),
	}
	if e.inst != nil {
		info.Status = "in-use"
		info.InstanceID = e.inst.id
		info.DeviceIndex = e.deviceIndex
		info.NetworkCard = e.networkCard
		info.AttachmentID = e.attachmentID
		info.AttachmentStatus = e.attachStatus
		info.DeleteOnTermination = e.deleteOnTerm
	}
	return info
}

func (c *Cloud) sortedENIIDsLocked() []string {
	ids := make([]string, 0, len(c.enis))
	for id := range c.enis {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func itoa(n int) string { return strconv.Itoa(n) }
