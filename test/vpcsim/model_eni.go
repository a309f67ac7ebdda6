package vpcsim

import (
	"net/netip"
	"slices"
	"time"
)

// createENIRequest is CreateNetworkInterface's input, parsed.
type createENIRequest struct {
	subnetID    string
	description string
	groups      []string
	primary     netip.Addr   // optional explicit primary address
	secondaries []netip.Addr // explicit secondary addresses
	count       int          // SecondaryPrivateIpAddressCount
	prefixes    []netip.Prefix
	prefixCount int
	tags        map[string]string
	noIPv6      bool // no IPv6 address even if the subnet assigns one on creation
}

// createENILocked creates an unattached ENI (EC2 CreateNetworkInterface).
// Nothing is held when it fails.
func (c *Cloud) createENILocked(req createENIRequest) (*eni, *Error) {
	s, ok := c.subnets[req.subnetID]
	if !ok {
		return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", req.subnetID)
	}
	groups, err := c.resolveGroupsLocked(req.groups)
	if err != nil {
		return nil, err
	}
	want := 1 + len(req.secondaries) + req.count + len(req.prefixes) + req.prefixCount
	if want > maxIPv4PerENI {
		return nil, errorf("PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit.")
	}
	if (len(req.secondaries) > 0 || req.count > 0) && (len(req.prefixes) > 0 || req.prefixCount > 0) {
		return nil, errorf("InvalidParameterCombination", "You cannot specify both IPv4 prefixes and secondary private IPv4 addresses.")
	}
	e := &eni{
		id:          c.newIDLocked("eni"),
		mac:         c.newMACLocked(),
		subnetID:    s.id,
		description: req.description,
		groups:      groups,
		tags:        copyTags(req.tags),
	}
	var h holds
	h.s = s
	explicit := req.secondaries
	if req.primary.IsValid() {
		explicit = append([]netip.Addr{req.primary}, explicit...)
	}
	if err := c.holdExplicitLocked(&h, e, explicit, false); err != nil {
		return nil, err
	}
	if !req.primary.IsValid() {
		a := s.takeAddrs(1)
		if a == nil {
			h.undo()
			return nil, errSubnetFull(s.id)
		}
		h.addrs = append(a, h.addrs...)
	}
	e.primary = h.addrs[0]
	if err := c.holdNewLocked(&h, req.count, req.prefixes, req.prefixCount); err != nil {
		h.undo()
		return nil, err
	}
	e.secondaries = append(e.secondaries, h.addrs[1:]...)
	e.prefixes = append(e.prefixes, h.prefixes...)
	if s.v6 != nil && s.v6.autoAssign && !req.noIPv6 {
		e.ipv6 = s.v6.takeAddrs(1)
	}
	c.enis[e.id] = e
	return e, nil
}

func (c *Cloud) resolveGroupsLocked(ids []string) ([]string, *Error) {
	if len(ids) == 0 {
		for id, g := range c.groups {
			if g.name == "default" {
				return []string{id}, nil
			}
		}
	}
	for _, id := range ids {
		if _, ok := c.groups[id]; !ok {
			return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist in VPC '%s'", id, c.vpc.id)
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(ids))), nil
}

// launchLocked starts an instance with its primary ENI at device 0.
func (c *Cloud) launchLocked(instanceType, subnetID string) (*instance, *Error) {
	it, ok := LookupInstanceType(instanceType)
	if !ok {
		return nil, errorf("InvalidParameterValue", "Invalid value '%s' for InstanceType.", instanceType)
	}
	if subnetID == "" {
		subnetID = c.subnetIDs[0]
	}
	s, ok := c.subnets[subnetID]
	if !ok {
		return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", subnetID)
	}
	e, err := c.createENILocked(createENIRequest{subnetID: subnetID, noIPv6: !it.IPv6Supported})
	if err != nil {
		return nil, err
	}
	inst := &instance{
		id: c.newIDLocked("i"), typ: instanceType, itype: it, subnetID: subnetID, az: s.az,
		state: "running", launched: time.Now(), tags: map[string]string{},
	}
	c.instances[inst.id] = inst
	c.attachNowLocked(e, inst, 0, it.DefaultNetworkCard)
	e.deleteOnTerm = true
	c.notifyAttachedLocked(e)
	return inst, nil
}

func (c *Cloud) attachNowLocked(e *eni, inst *instance, device, card int) {
	e.inst = inst
	e.attachmentID = c.newIDLocked("eni-attach")
	e.deviceIndex = device
	e.networkCard = card
	e.attachStatus = "attached"
	e.attachTime = time.Now()
	e.deleteOnTerm = false
	inst.enis = append(inst.enis, e)
	slices.SortFunc(inst.enis, func(a, b *eni) int { return a.deviceIndex - b.deviceIndex })
}

// attachLocked attaches an available ENI to a running instance
// (EC2 AttachNetworkInterface).
func (c *Cloud) attachLocked(eniID, instanceID string, device, card int) (*eni, *Error) {
	e, ok := c.enis[eniID]
	if !ok {
		return nil, errENINotFound(eniID)
	}
	inst, ok := c.instances[instanceID]
	if !ok {
		return nil, errInstanceNotFound(instanceID)
	}
	if inst.state != "running" {
		return nil, errorf("IncorrectInstanceState", "The instance '%s' is not in a valid state for this operation.", inst.id)
	}
	if e.inst != nil {
		return nil, errorf("InvalidNetworkInterface.InUse", "Interface: [%s] in use.", e.id)
	}
	if c.subnets[e.subnetID].az != inst.az {
		return nil, errorf("InvalidParameterValue", "The network interface '%s' and instance '%s' are not in the same availability zone", e.id, inst.id)
	}
	if card < 0 || card >= inst.itype.MaxNetworkCards {
		return nil, errBadValue("NetworkCardIndex", itoa(card), "The network card index is not valid for the instance type.")
	}
	if device < 1 {
		return nil, errBadValue("DeviceIndex", itoa(device), "Device index must be 1 or greater.")
	}
	onCard := 0
	for _, o := range inst.enis {
		if o.networkCard == card {
			onCard++
			if o.deviceIndex == device {
				return nil, errorf("InvalidParameterValue", "Instance '%s' already has an interface attached at device index '%d'.", inst.id, device)
			}
		}
	}
	if onCard >= inst.itype.maxENIsOnCard(card) || len(inst.enis) >= inst.itype.MaxENIs {
		return nil, errorf("AttachmentLimitExceeded", "Interface count %d exceeds the limit for %s", len(inst.enis)+1, inst.typ)
	}
	if e.slots() > inst.itype.IPv4PerENI {
		return nil, errorf("PrivateIpAddressLimitExceeded", "Number of private addresses on %s exceeds the limit of %s.", e.id, inst.typ)
	}
	if len(e.prefixes) > 0 && !inst.itype.PrefixDelegation() {
		return nil, errorf("InvalidParameterValue", "Prefix delegation is not supported for instance type %s.", inst.typ)
	}
	if err := checkIPv6OnAttach(e, inst); err != nil {
		return nil, err
	}
	c.attachNowLocked(e, inst, device, card)
	if c.cfg.AttachDelay <= 0 {
		c.notifyAttachedLocked(e)
		return e, nil
	}
	e.attachStatus = "attaching"
	id := e.attachmentID
	time.AfterFunc(c.cfg.AttachDelay, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if e.attachmentID == id && e.attachStatus == "attaching" {
			e.attachStatus = "attached"
			c.notifyAttachedLocked(e)
			c.recordENIsLocked()
		}
	})
	return e, nil
}

// detachLocked starts detaching the ENI with the given attachment id
// (EC2 DetachNetworkInterface). The ENI leaves the instance at once (the
// fabric drops its link) and turns "available" after Config.DetachDelay.
// An attachment still "attaching" is cancelled; the fabric never saw it.
func (c *Cloud) detachLocked(attachmentID string) *Error {
	var e *eni
	for _, x := range c.enis {
		if x.inst != nil && x.attachmentID == attachmentID {
			e = x
		}
	}
	if e == nil {
		return errorf("InvalidAttachmentID.NotFound", "The attachment ID '%s' does not exist", attachmentID)
	}
	if e.deviceIndex == 0 {
		return errorf("OperationNotPermitted", "The network interface at device index 0 cannot be detached.")
	}
	if e.attachStatus == "detaching" {
		return nil
	}
	wasAttached := e.attachStatus == "attached"
	e.attachStatus = "detaching"
	inst := e.inst
	if wasAttached {
		c.notifyDetachedLocked(inst, e)
	}
	if c.cfg.DetachDelay <= 0 {
		c.finishDetachLocked(e)
		return nil
	}
	time.AfterFunc(c.cfg.DetachDelay, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if e.attachmentID == attachmentID && e.attachStatus == "detaching" {
			c.finishDetachLocked(e)
			c.recordENIsLocked()
		}
	})
	return nil
}

func (c *Cloud) finishDetachLocked(e *eni) {
	inst := e.inst
	inst.enis = slices.DeleteFunc(inst.enis, func(o *eni) bool { return o == e })
	e.inst, e.attachmentID, e.attachStatus, e.deviceIndex, e.networkCard = nil, "", "", 0, 0
	e.deleteOnTerm = false
}

// deleteENILocked deletes an unattached ENI and frees its addresses
// (EC2 DeleteNetworkInterface).
func (c *Cloud) deleteENILocked(id string) *Error {
	e, ok := c.enis[id]
	if !ok {
		return errENINotFound(id)
	}
	if e.inst != nil {
		return errorf("InvalidNetworkInterface.InUse", "The network interface '%s' is currently in use.", id)
	}
	c.freeENILocked(e)
	return nil
}

func (c *Cloud) freeENILocked(e *eni) {
	s := c.subnets[e.subnetID]
	s.release(e.primary)
	for _, a := range e.secondaries {
		s.release(a)
	}
	for _, p := range e.prefixes {
		s.releasePrefix(p)
	}
	s.v6.releaseAll(e.ipv6, e.ipv6Prefixes)
	delete(c.enis, e.id)
	for t, ct := range c.tokens {
		if ct.eniID == e.id {
			delete(c.tokens, t)
		}
	}
}

// terminateLocked terminates an instance (EC2 TerminateInstances): ENIs with
// delete-on-termination are deleted, the others detached and left available.
// It returns the previous state.
func (c *Cloud) terminateLocked(id string) (string, *Error) {
	inst, ok := c.instances[id]
	if !ok {
		return "", errInstanceNotFound(id)
	}
	prev := inst.state
	if prev == "terminated" {
		return prev, nil
	}
	for _, e := range slices.Clone(inst.enis) {
		if e.attachStatus == "attached" {
			c.notifyDetachedLocked(inst, e)
		}
		del := e.deleteOnTerm
		c.finishDetachLocked(e)
		if del {
			c.freeENILocked(e)
		}
	}
	inst.state = "terminated"
	if c.observer != nil {
		c.observer.InstanceTerminated(inst.id)
	}
	return prev, nil
}

func (c *Cloud) notifyAttachedLocked(e *eni) {
	c.recordIMDSLocked(e.inst)
	if c.observer != nil {
		c.observer.ENIAttached(e.inst.id, c.eniInfoLocked(e))
	}
}

func (c *Cloud) notifyDetachedLocked(inst *instance, e *eni) {
	c.recordIMDSLocked(inst)
	if c.observer != nil {
		c.observer.ENIDetached(inst.id, e.id)
	}
}

// slots is the number of the per-ENI IPv4 slots the ENI uses: its primary
// address, each secondary address and each /28 prefix.
func (e *eni) slots() int { return 1 + len(e.secondaries) + len(e.prefixes) }

// addressLimit is the per-ENI slot limit: the instance type's IPv4 addresses
// per interface when attached, the largest such figure of any type when not.
func (e *eni) addressLimit() int {
	if e.inst != nil {
		return e.inst.itype.IPv4PerENI
	}
	return maxIPv4PerENI
}

func (e *eni) prefixesAllowed() bool {
	return e.inst == nil || e.inst.itype.PrefixDelegation()
}
