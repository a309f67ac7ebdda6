package vpcsim

import (
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

type createENIReply struct {
	meta
	NetworkInterface xmlENI `xml:"networkInterface"`
	ClientToken      string `xml:"clientToken,omitempty"`
}

// createENIActionLocked is EC2 CreateNetworkInterface. A repeated ClientToken
// with the same parameters returns the ENI the first call created; with other
// parameters it is refused (IdempotentParameterMismatch).
func (c *Cloud) createENIActionLocked(p params) (reply, *Error) {
	req, err := parseCreateENI(p)
	if err != nil {
		return nil, err
	}
	token := p.get("ClientToken")
	if len(token) > 64 {
		return nil, errBadValue("ClientToken", token, "The client token must be at most 64 characters.")
	}
	sig := requestSignature(p)
	if ct, ok := c.tokens[token]; ok && token != "" {
		if ct.params != sig {
			return nil, errorf("IdempotentParameterMismatch", "The client token %s was used with different parameters.", token)
		}
		if e, ok := c.enis[ct.eniID]; ok {
			return &createENIReply{NetworkInterface: c.eniXMLLocked(e, false), ClientToken: token}, nil
		}
	}
	e, err := c.createENILocked(req)
	if err != nil {
		return nil, err
	}
	if token != "" {
		c.tokens[token] = clientToken{eniID: e.id, params: sig}
	}
	return &createENIReply{NetworkInterface: c.eniXMLLocked(e, false), ClientToken: token}, nil
}

func parseCreateENI(p params) (createENIRequest, *Error) {
	var req createENIRequest
	var err *Error
	if req.subnetID, err = p.required("SubnetId"); err != nil {
		return req, err
	}
	req.description = p.get("Description")
	if req.groups, err = p.list("SecurityGroupId"); err != nil {
		return req, err
	}
	if s := p.get("PrivateIpAddress"); s != "" {
		if req.primary, err = parseAddr("PrivateIpAddress", s); err != nil {
			return req, err
		}
	}
	bases, err := p.indexed("PrivateIpAddresses")
	if err != nil {
		return req, err
	}
	for _, b := range bases {
		a, err := parseAddr(b+".PrivateIpAddress", p.get(b+".PrivateIpAddress"))
		if err != nil {
			return req, err
		}
		primary, err := p.boolParam(b+".Primary", false)
		if err != nil {
			return req, err
		}
		switch {
		case primary && req.primary.IsValid() && req.primary != a:
			return req, errorf("InvalidParameterCombination", "Only one primary private address may be specified.")
		case primary:
			req.primary = a
		default:
			req.secondaries = append(req.secondaries, a)
		}
	}
	if req.count, err = p.intParam("SecondaryPrivateIpAddressCount", 0, 1, maxListEntries); err != nil {
		return req, err
	}
	if req.prefixCount, err = p.intParam("Ipv4PrefixCount", 0, 1, maxListEntries); err != nil {
		return req, err
	}
	if req.prefixes, err = p.prefixList("Ipv4Prefix", "Ipv4Prefix"); err != nil {
		return req, err
	}
	req.tags, err = p.tagSpecs("network-interface")
	return req, err
}

// requestSignature is a canonical form of a request's parameters, except
// those that do not define the request, for ClientToken comparison.
func requestSignature(p params) string {
	v := url.Values{}
	for k, vals := range p {
		switch k {
		case "Action", "Version", "ClientToken", "DryRun":
		default:
			v[k] = vals
		}
	}
	return v.Encode()
}

type attachReply struct {
	meta
	AttachmentID     string `xml:"attachmentId"`
	NetworkCardIndex int    `xml:"networkCardIndex"`
}

// attachActionLocked is EC2 AttachNetworkInterface.
func (c *Cloud) attachActionLocked(p params) (reply, *Error) {
	eniID, err := p.required("NetworkInterfaceId")
	if err != nil {
		return nil, err
	}
	instID, err := p.required("InstanceId")
	if err != nil {
		return nil, err
	}
	if _, err := p.required("DeviceIndex"); err != nil {
		return nil, err
	}
	device, err := p.intParam("DeviceIndex", 0, 0, 1<<16)
	if err != nil {
		return nil, err
	}
	card := -1
	if inst, ok := c.instances[instID]; ok {
		card = inst.itype.DefaultNetworkCard
	}
	if card, err = p.intParam("NetworkCardIndex", card, 0, 1<<10); err != nil {
		return nil, err
	}
	e, err := c.attachLocked(eniID, instID, device, card)
	if err != nil {
		return nil, err
	}
	return &attachReply{AttachmentID: e.attachmentID, NetworkCardIndex: e.networkCard}, nil
}

// detachActionLocked is EC2 DetachNetworkInterface.
func (c *Cloud) detachActionLocked(p params) (reply, *Error) {
	id, err := p.required("AttachmentId")
	if err != nil {
		return nil, err
	}
	if _, err := p.boolParam("Force", false); err != nil {
		return nil, err
	}
	if err := c.detachLocked(id); err != nil {
		return nil, err
	}
	return &returnReply{Return: true}, nil
}

// deleteENIActionLocked is EC2 DeleteNetworkInterface.
func (c *Cloud) deleteENIActionLocked(p params) (reply, *Error) {
	id, err := p.required("NetworkInterfaceId")
	if err != nil {
		return nil, err
	}
	if err := c.deleteENILocked(id); err != nil {
		return nil, err
	}
	return &returnReply{Return: true}, nil
}

// modifyENIActionLocked is EC2 ModifyNetworkInterfaceAttribute for the
// attributes vpcip uses: Attachment.DeleteOnTermination, SecurityGroupId.N,
// Description.Value, SourceDestCheck.Value (accepted, always true here).
// EC2 takes one attribute per call.
func (c *Cloud) modifyENIActionLocked(p params) (reply, *Error) {
	id, err := p.required("NetworkInterfaceId")
	if err != nil {
		return nil, err
	}
	e, ok := c.enis[id]
	if !ok {
		return nil, errENINotFound(id)
	}
	groups, err := p.list("SecurityGroupId")
	if err != nil {
		return nil, err
	}
	attrs := 0
	for _, k := range []string{"Attachment.AttachmentId", "Description.Value", "SourceDestCheck.Value"} {
		if p.get(k) != "" {
			attrs++
		}
	}
	if len(groups) > 0 {
		attrs++
	}
	if attrs != 1 {
		return nil, errorf("InvalidParameterCombination", "Specify exactly one attribute to modify.")
	}
	switch {
	case len(groups) > 0:
		if e.groups, err = c.resolveGroupsLocked(groups); err != nil {
			return nil, err
		}
	case p.get("Description.Value") != "":
		e.description = p.get("Description.Value")
	case p.get("SourceDestCheck.Value") != "":
		if _, err := p.boolParam("SourceDestCheck.Value", true); err != nil {
			return nil, err
		}
	default:
		att := p.get("Attachment.AttachmentId")
		if e.inst == nil || e.attachmentID != att {
			return nil, errorf("InvalidAttachmentID.NotFound", "The attachment ID '%s' does not exist", att)
		}
		if _, err := p.required("Attachment.DeleteOnTermination"); err != nil {
			return nil, err
		}
		if e.deleteOnTerm, err = p.boolParam("Attachment.DeleteOnTermination", false); err != nil {
			return nil, err
		}
	}
	return &returnReply{Return: true}, nil
}

type assignReply struct {
	meta
	NetworkInterfaceID string         `xml:"networkInterfaceId"`
	Assigned           []xmlPrivateIP `xml:"assignedPrivateIpAddressesSet>item"`
	AssignedPrefixes   []xmlPrefix    `xml:"assignedIpv4PrefixSet>item"`
}

// assignActionLocked is EC2 AssignPrivateIpAddresses.
func (c *Cloud) assignActionLocked(p params) (reply, *Error) {
	var req assignRequest
	var err *Error
	if req.eniID, err = p.required("NetworkInterfaceId"); err != nil {
		return nil, err
	}
	if req.count, err = p.intParam("SecondaryPrivateIpAddressCount", 0, 1, maxListEntries); err != nil {
		return nil, err
	}
	if req.prefixCount, err = p.intParam("Ipv4PrefixCount", 0, 1, maxListEntries); err != nil {
		return nil, err
	}
	if req.addrs, err = p.addrList("PrivateIpAddress"); err != nil {
		return nil, err
	}
	if req.prefixes, err = p.prefixList("Ipv4Prefix", ""); err != nil {
		return nil, err
	}
	if req.reassign, err = p.boolParam("AllowReassignment", false); err != nil {
		return nil, err
	}
	addrs, prefixes, err := c.assignLocked(req)
	if err != nil {
		return nil, err
	}
	r := &assignReply{NetworkInterfaceID: req.eniID}
	for _, a := range addrs {
		r.Assigned = append(r.Assigned, xmlPrivateIP{PrivateIPAddress: a.String()})
	}
	for _, pf := range prefixes {
		r.AssignedPrefixes = append(r.AssignedPrefixes, xmlPrefix{pf.String()})
	}
	return r, nil
}

// unassignActionLocked is EC2 UnassignPrivateIpAddresses.
func (c *Cloud) unassignActionLocked(p params) (reply, *Error) {
	id, err := p.required("NetworkInterfaceId")
	if err != nil {
		return nil, err
	}
	addrs, err := p.addrList("PrivateIpAddress")
	if err != nil {
		return nil, err
	}
	prefixes, err := p.prefixList("Ipv4Prefix", "")
	if err != nil {
		return nil, err
	}
	if err := c.unassignLocked(id, dedupe(addrs), dedupe(prefixes)); err != nil {
		return nil, err
	}
	return &returnReply{Return: true}, nil
}

func dedupe[T comparable](in []T) []T {
	out := in[:0:0]
	for _, v := range in {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

type terminateReply struct {
	meta
	Instances []xmlStateChange `xml:"instancesSet>item"`
}

type xmlStateChange struct {
	InstanceID    string           `xml:"instanceId"`
	CurrentState  xmlInstanceState `xml:"currentState"`
	PreviousState xmlInstanceState `xml:"previousState"`
}

// terminateActionLocked is EC2 TerminateInstances. Every id must exist.
func (c *Cloud) terminateActionLocked(p params) (reply, *Error) {
	ids, err := p.list("InstanceId")
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errMissing("InstanceId.1")
	}
	for _, id := range ids {
		if _, ok := c.instances[id]; !ok {
			return nil, errInstanceNotFound(id)
		}
	}
	r := &terminateReply{}
	for _, id := range dedupe(ids) {
		prev, _ := c.terminateLocked(id)
		r.Instances = append(r.Instances, xmlStateChange{id, instanceState("terminated"), instanceState(prev)})
	}
	return r, nil
}

// addrsOf returns every IPv4 address of an ENI as text, primary first, as
// filters and IMDS's local-ipv4s list them.
func addrsOf(e *eni) []string {
	out := []string{e.primary.String()}
	for _, a := range e.secondaries {
		out = append(out, a.String())
	}
	return out
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// tagsOfLocked returns the tag map of the resource with the given id.
func (c *Cloud) tagsOfLocked(id string) (map[string]string, *Error) {
	kind, _, _ := strings.Cut(id, "-")
	switch kind {
	case "eni":
		if e, ok := c.enis[id]; ok {
			return e.tags, nil
		}
		return nil, errENINotFound(id)
	case "i":
		if inst, ok := c.instances[id]; ok {
			return inst.tags, nil
		}
		return nil, errInstanceNotFound(id)
	case "subnet":
		if s, ok := c.subnets[id]; ok {
			return s.tags, nil
		}
		return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
	case "sg":
		if g, ok := c.groups[id]; ok {
			return g.tags, nil
		}
		return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
	case "vpc":
		if id == c.vpc.id {
			return c.vpc.tags, nil
		}
		return nil, errorf("InvalidVpcID.NotFound", "The vpc ID '%s' does not exist", id)
	}
	return nil, errorf("InvalidID", "The ID '%s' is not valid", id)
}
