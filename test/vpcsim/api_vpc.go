package vpcsim

import (
	"slices"
	"strconv"
	"strings"
)

type describeSubnetsReply struct {
	meta
	Subnets   []xmlSubnet `xml:"subnetSet>item"`
	NextToken string      `xml:"nextToken,omitempty"`
}

type xmlSubnet struct {
	SubnetID                string   `xml:"subnetId"`
	SubnetArn               string   `xml:"subnetArn"`
	State                   string   `xml:"state"`
	OwnerID                 string   `xml:"ownerId"`
	VpcID                   string   `xml:"vpcId"`
	CidrBlock               string   `xml:"cidrBlock"`
	AvailableIPAddressCount int      `xml:"availableIpAddressCount"`
	AvailabilityZone        string   `xml:"availabilityZone"`
	DefaultForAz            bool     `xml:"defaultForAz"`
	MapPublicIPOnLaunch     bool     `xml:"mapPublicIpOnLaunch"`
	TagSet                  []xmlTag `xml:"tagSet>item"`
	// Ipv6CidrBlocks is the subnet's /64, when it has one.
	Ipv6CidrBlocks []xmlSubnetIPv6 `xml:"ipv6CidrBlockAssociationSet>item"`
}

type xmlSubnetIPv6 struct {
	AssociationID string          `xml:"associationId"`
	Ipv6CidrBlock string          `xml:"ipv6CidrBlock"`
	State         xmlCidrBlockSet `xml:"ipv6CidrBlockState"`
}

type xmlCidrBlockSet struct {
	State string `xml:"state"`
}

// describeSubnetsLocked is EC2 DescribeSubnets (MaxResults 5..1000).
func (c *Cloud) describeSubnetsLocked(p params) (reply, *Error) {
	all := slices.Sorted(slices.Values(c.subnetIDs))
	field := func(id string) fieldFunc { return c.subnetFieldLocked(c.subnets[id]) }
	in, err := parseDescribe(p, "SubnetId", 5, 1000, c.subnetFieldLocked(&subnet{}))
	if err != nil {
		return nil, err
	}
	ids, next, err := selectIDs(all, in, field, func(id string) *Error {
		return errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
	})
	if err != nil {
		return nil, err
	}
	r := &describeSubnetsReply{NextToken: next}
	for _, id := range ids {
		s := c.subnets[id]
		x := xmlSubnet{
			SubnetID: s.id, SubnetArn: "arn:aws:ec2:" + c.cfg.Region + ":" + AccountID + ":subnet/" + s.id,
			State: "available", OwnerID: AccountID, VpcID: c.vpc.id, CidrBlock: s.cidr.String(),
			AvailableIPAddressCount: s.free, AvailabilityZone: s.az, TagSet: tagSet(s.tags),
		}
		if s.v6 != nil {
			x.Ipv6CidrBlocks = []xmlSubnetIPv6{{AssociationID: "subnet-cidr-assoc-" + strings.TrimPrefix(s.id, "subnet-"), Ipv6CidrBlock: s.v6.cidr.String(), State: xmlCidrBlockSet{"associated"}}}
		}
		r.Subnets = append(r.Subnets, x)
	}
	return r, nil
}

func (c *Cloud) subnetFieldLocked(s *subnet) fieldFunc {
	return func(name string) ([]string, bool) {
		one := func(v string) ([]string, bool) { return []string{v}, true }
		switch name {
		case "subnet-id":
			return one(s.id)
		case "vpc-id":
			return one(c.vpc.id)
		case "availability-zone":
			return one(s.az)
		case "cidr-block", "cidr", "cidrBlock":
			return one(s.cidr.String())
		case "state":
			return one("available")
		case "owner-id":
			return one(AccountID)
		case "available-ip-address-count":
			return one(strconv.Itoa(s.free))
		case "ipv6-cidr-block-association.ipv6-cidr-block":
			if s.v6 == nil {
				return nil, true
			}
			return one(s.v6.cidr.String())
		}
		return tagField(s.tags, name)
	}
}

type describeGroupsReply struct {
	meta
	Groups    []xmlSecurityGroup `xml:"securityGroupInfo>item"`
	NextToken string             `xml:"nextToken,omitempty"`
}

type xmlSecurityGroup struct {
	OwnerID          string   `xml:"ownerId"`
	GroupID          string   `xml:"groupId"`
	GroupName        string   `xml:"groupName"`
	GroupDescription string   `xml:"groupDescription"`
	VpcID            string   `xml:"vpcId"`
	TagSet           []xmlTag `xml:"tagSet>item"`
}

// describeSecurityGroupsLocked is EC2 DescribeSecurityGroups (MaxResults 5..1000).
func (c *Cloud) describeSecurityGroupsLocked(p params) (reply, *Error) {
	var all []string
	for id := range c.groups {
		all = append(all, id)
	}
	slices.Sort(all)
	field := func(id string) fieldFunc { return c.groupFieldLocked(c.groups[id]) }
	in, err := parseDescribe(p, "GroupId", 5, 1000, c.groupFieldLocked(&securityGroup{}))
	if err != nil {
		return nil, err
	}
	names, err := p.list("GroupName")
	if err != nil {
		return nil, err
	}
	if len(names) > 0 {
		in.filters = append(in.filters, filter{name: "group-name", values: names})
	}
	ids, next, err := selectIDs(all, in, field, func(id string) *Error {
		return errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
	})
	if err != nil {
		return nil, err
	}
	r := &describeGroupsReply{NextToken: next}
	for _, id := range ids {
		g := c.groups[id]
		r.Groups = append(r.Groups, xmlSecurityGroup{
			OwnerID: AccountID, GroupID: g.id, GroupName: g.name, GroupDescription: g.description,
			VpcID: c.vpc.id, TagSet: tagSet(g.tags),
		})
	}
	return r, nil
}

func (c *Cloud) groupFieldLocked(g *securityGroup) fieldFunc {
	return func(name string) ([]string, bool) {
		switch name {
		case "group-id":
			return []string{g.id}, true
		case "group-name":
			return []string{g.name}, true
		case "description":
			return []string{g.description}, true
		case "vpc-id":
			return []string{c.vpc.id}, true
		case "owner-id":
			return []string{AccountID}, true
		}
		return tagField(g.tags, name)
	}
}

type describeTypesReply struct {
	meta
	InstanceTypes []xmlInstanceType `xml:"instanceTypeSet>item"`
	NextToken     string            `xml:"nextToken,omitempty"`
}

// describeInstanceTypesLocked is EC2 DescribeInstanceTypes: MaxResults
// 5..100, and like EC2 it pages by 100 when MaxResults is absent.
func (c *Cloud) describeInstanceTypesLocked(p params) (reply, *Error) {
	in, err := parseDescribe(p, "InstanceType", 5, 100, typeField(InstanceType{}))
	if err != nil {
		return nil, err
	}
	if in.maxResults == 0 && len(in.ids) == 0 {
		in.maxResults = 100
	}
	field := func(name string) fieldFunc { return typeField(typesByName[name]) }
	ids, next, err := selectIDs(typeNames, in, field, func(name string) *Error {
		return errorf("InvalidInstanceType", "The following supplied instance types do not exist: [%s]", name)
	})
	if err != nil {
		return nil, err
	}
	r := &describeTypesReply{NextToken: next}
	for _, name := range ids {
		r.InstanceTypes = append(r.InstanceTypes, instanceTypeXML(typesByName[name]))
	}
	return r, nil
}

func typeField(t InstanceType) fieldFunc {
	return func(name string) ([]string, bool) {
		switch name {
		case "instance-type":
			return []string{t.Name}, true
		case "hypervisor":
			return []string{t.Hypervisor}, true
		case "bare-metal":
			return []string{strconv.FormatBool(t.BareMetal)}, true
		case "processor-info.supported-architecture":
			return t.Architectures, true
		case "network-info.maximum-network-interfaces":
			return []string{strconv.Itoa(t.MaxENIs)}, true
		case "network-info.ipv4-addresses-per-interface":
			return []string{strconv.Itoa(t.IPv4PerENI)}, true
		}
		return nil, false
	}
}

// maxTagsPerResource is EC2's limit of user tags on one resource.
const maxTagsPerResource = 50

func checkTags(tags map[string]string) *Error {
	if len(tags) > maxTagsPerResource {
		return errorf("TagLimitExceeded", "The maximum number of tags per resource (%d) was exceeded.", maxTagsPerResource)
	}
	for k := range tags {
		if strings.HasPrefix(strings.ToLower(k), "aws:") {
			return errorf("InvalidParameterValue", "Tag keys starting with 'aws:' are reserved for internal use.")
		}
	}
	return nil
}

// createTagsLocked is EC2 CreateTags: every resource must exist, and no
// resource ends with more than 50 tags; nothing changes otherwise.
func (c *Cloud) createTagsLocked(p params) (reply, *Error) {
	ids, err := p.list("ResourceId")
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errMissing("ResourceId.1")
	}
	tags, keys, err := p.tags("Tag")
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errMissing("Tag.1.Key")
	}
	if err := checkTags(tags); err != nil {
		return nil, err
	}
	var targets []map[string]string
	for _, id := range ids {
		m, err := c.tagsOfLocked(id)
		if err != nil {
			return nil, err
		}
		merged := copyTags(m)
		for k, v := range tags {
			merged[k] = v
		}
		if err := checkTags(merged); err != nil {
			return nil, err
		}
		targets = append(targets, m)
	}
	for _, m := range targets {
		for k, v := range tags {
			m[k] = v
		}
	}
	return &returnReply{Return: true}, nil
}

// deleteTagsLocked is EC2 DeleteTags: Tag.N.Key with an optional Tag.N.Value
// (the tag goes only if its value matches); no Tag.N deletes every tag.
func (c *Cloud) deleteTagsLocked(p params) (reply, *Error) {
	ids, err := p.list("ResourceId")
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errMissing("ResourceId.1")
	}
	bases, err := p.indexed("Tag")
	if err != nil {
		return nil, err
	}
	var targets []map[string]string
	for _, id := range ids {
		m, err := c.tagsOfLocked(id)
		if err != nil {
			return nil, err
		}
		targets = append(targets, m)
	}
	for _, m := range targets {
		if len(bases) == 0 {
			clear(m)
		}
		for _, b := range bases {
			k := p.get(b + ".Key")
			_, hasValue := p[b+".Value"]
			if !hasValue || m[k] == p.get(b+".Value") {
				delete(m, k)
			}
		}
	}
	return &returnReply{Return: true}, nil
}
