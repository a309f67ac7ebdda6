package vpcsim

import (
	"maps"
	"slices"
	"strconv"
)

// describeInput is what every Describe action shares: explicit ids, filters
// and pagination.
type describeInput struct {
	ids        []string
	filters    []filter
	maxResults int // 0 = no limit
	token      string
}

// parseDescribe reads idKey.N, Filter.N, MaxResults (within [lo, hi]) and
// NextToken. As EC2 does, it refuses MaxResults together with explicit ids.
func parseDescribe(p params, idKey string, lo, hi int, probe fieldFunc) (describeInput, *Error) {
	var in describeInput
	var err *Error
	if in.ids, err = p.list(idKey); err != nil {
		return in, err
	}
	if in.filters, err = p.filters(); err != nil {
		return in, err
	}
	if err = checkFilters(in.filters, probe); err != nil {
		return in, err
	}
	if in.maxResults, err = p.intParam("MaxResults", 0, lo, hi); err != nil {
		return in, err
	}
	if in.maxResults > 0 && len(in.ids) > 0 {
		return in, errorf("InvalidParameterCombination", "The parameter %s cannot be used with the parameter MaxResults", idKey)
	}
	in.token = p.get("NextToken")
	return in, nil
}

// selectIDs applies explicit ids (each must exist: notFound names the
// error), filters and pagination to the sorted ids of all resources.
func selectIDs(all []string, in describeInput, field func(id string) fieldFunc, notFound func(id string) *Error) ([]string, string, *Error) {
	cand := all
	if len(in.ids) > 0 {
		cand = nil
		for _, id := range dedupe(in.ids) {
			if _, found := slices.BinarySearch(all, id); !found {
				return nil, "", notFound(id)
			}
			cand = append(cand, id)
		}
		slices.Sort(cand)
	}
	var out []string
	for _, id := range cand {
		if matches(in.filters, field(id)) {
			out = append(out, id)
		}
	}
	return paginate(out, in.maxResults, in.token)
}

type describeENIsReply struct {
	meta
	NetworkInterfaces []xmlENI `xml:"networkInterfaceSet>item"`
	NextToken         string   `xml:"nextToken,omitempty"`
}

// describeENIsLocked is EC2 DescribeNetworkInterfaces (MaxResults 5..1000).
func (c *Cloud) describeENIsLocked(p params) (reply, *Error) {
	enis := c.visibleENIsLocked()
	field := func(id string) fieldFunc { return c.eniFieldLocked(enis[id]) }
	in, err := parseDescribe(p, "NetworkInterfaceId", 5, 1000, c.eniFieldLocked(&eni{}))
	if err != nil {
		return nil, err
	}
	all := slices.Sorted(maps.Keys(enis))
	ids, next, err := selectIDs(all, in, field, func(id string) *Error { return errENINotFound(id) })
	if err != nil {
		return nil, err
	}
	r := &describeENIsReply{NextToken: next}
	for _, id := range ids {
		r.NetworkInterfaces = append(r.NetworkInterfaces, c.eniXMLLocked(enis[id], false))
	}
	return r, nil
}

func (c *Cloud) eniFieldLocked(e *eni) fieldFunc {
	return func(name string) ([]string, bool) {
		one := func(s string) ([]string, bool) { return []string{s}, true }
		az := ""
		if s, ok := c.subnets[e.subnetID]; ok {
			az = s.az
		}
		switch name {
		case "network-interface-id":
			return one(e.id)
		case "subnet-id":
			return one(e.subnetID)
		case "vpc-id":
			return one(c.vpc.id)
		case "availability-zone":
			return one(az)
		case "description":
			return one(e.description)
		case "mac-address":
			return one(e.mac)
		case "owner-id":
			return one(AccountID)
		case "interface-type":
			return one("interface")
		case "requester-managed":
			return one(strconv.FormatBool(e.requesterManaged))
		case "private-ip-address", "addresses.private-ip-address":
			return addrsOf(e), true
		case "ipv4-prefixes.ipv4-prefix":
			return prefixStrings(e.prefixes), true
		case "ipv6-addresses.ipv6-address":
			out := make([]string, len(e.ipv6))
			for i, a := range e.ipv6 {
				out[i] = a.String()
			}
			return out, true
		case "group-id":
			return e.groups, true
		case "status":
			if e.inst != nil {
				return one("in-use")
			}
			return one("available")
		case "attachment.instance-id", "attachment.status", "attachment.attachment-id",
			"attachment.device-index", "attachment.delete-on-termination", "attachment.instance-owner-id":
			return eniAttachmentField(e, name), true
		}
		return tagField(e.tags, name)
	}
}

func eniAttachmentField(e *eni, name string) []string {
	if e.inst == nil {
		return nil
	}
	switch name {
	case "attachment.instance-id":
		return []string{e.inst.id}
	case "attachment.status":
		return []string{e.attachStatus}
	case "attachment.attachment-id":
		return []string{e.attachmentID}
	case "attachment.device-index":
		return []string{strconv.Itoa(e.deviceIndex)}
	case "attachment.delete-on-termination":
		return []string{strconv.FormatBool(e.deleteOnTerm)}
	}
	return []string{AccountID}
}

type describeInstancesReply struct {
	meta
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

// describeInstancesLocked is EC2 DescribeInstances (MaxResults 5..1000), one
// reservation per instance.
func (c *Cloud) describeInstancesLocked(p params) (reply, *Error) {
	all := make([]string, 0, len(c.instances))
	for id := range c.instances {
		all = append(all, id)
	}
	slices.Sort(all)
	field := func(id string) fieldFunc { return c.instanceFieldLocked(c.instances[id]) }
	in, err := parseDescribe(p, "InstanceId", 5, 1000, c.instanceFieldLocked(&instance{}))
	if err != nil {
		return nil, err
	}
	ids, next, err := selectIDs(all, in, field, func(id string) *Error { return errInstanceNotFound(id) })
	if err != nil {
		return nil, err
	}
	r := &describeInstancesReply{NextToken: next}
	for _, id := range ids {
		inst := c.instances[id]
		r.Reservations = append(r.Reservations, xmlReservation{
			ReservationID: "r-" + id[len("i-"):], OwnerID: AccountID,
			Instances: []xmlInstance{c.instanceXMLLocked(inst)},
		})
	}
	return r, nil
}

func (c *Cloud) instanceFieldLocked(inst *instance) fieldFunc {
	return func(name string) ([]string, bool) {
		one := func(s string) ([]string, bool) { return []string{s}, true }
		switch name {
		case "instance-id":
			return one(inst.id)
		case "instance-type":
			return one(inst.typ)
		case "instance-state-name":
			return one(inst.state)
		case "availability-zone":
			return one(inst.az)
		case "subnet-id":
			return one(inst.subnetID)
		case "vpc-id":
			return one(c.vpc.id)
		case "private-ip-address", "network-interface.addresses.private-ip-address", "network-interface.network-interface-id":
			var out []string
			for _, e := range inst.enis {
				switch {
				case name == "network-interface.network-interface-id":
					out = append(out, e.id)
				case name == "private-ip-address" && e.deviceIndex == 0:
					out = append(out, e.primary.String())
				case name == "network-interface.addresses.private-ip-address":
					out = append(out, addrsOf(e)...)
				}
			}
			return out, true
		}
		return tagField(inst.tags, name)
	}
}
