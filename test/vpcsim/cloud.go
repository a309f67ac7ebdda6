// Package vpcsim is a VPC in a box: an in-memory model of one EC2 VPC (subnets,
// security groups, instances, ENIs with their secondary IPs and /28 prefixes)
// served through EC2's Query API (API version 2016-11-15) and IMDSv2, with
// injectable faults.
//
// The model follows EC2's rules where vpcip depends on them: AWS reserves the
// first four and the last address of every subnet; the gateway is the
// subnet's network address + 1; an ENI holds at most the instance type's
// "IPv4 addresses per interface", its primary address and each /28 prefix
// included; /28 prefixes are aligned, on Nitro or bare-metal types only; no
// address is ever held twice in the VPC. The VPC has an IPv6 /56 and each
// subnet a /64 of it (unless made without IPv6); IMDS lists ENIs' IPv6
// addresses and /80 prefixes and the fabric routes them (see ipv6.go).
// Instance-type limits come from a
// table of real EC2 figures embedded in the package.
//
// EC2Handler answers DescribeInstances, DescribeInstanceTypes,
// DescribeSubnets, DescribeSecurityGroups, DescribeNetworkInterfaces (with
// filters, NetworkInterfaceId.N and MaxResults/NextToken pages),
// CreateNetworkInterface (ClientToken idempotency, TagSpecification),
// Attach/Detach/DeleteNetworkInterface, ModifyNetworkInterfaceAttribute,
// Assign/UnassignPrivateIpAddresses (addresses and /28 prefixes, by count or
// explicitly), Assign/UnassignIpv6Addresses (IPv6 addresses and /80
// prefixes from the subnet's /64, by count or explicitly), CreateTags, DeleteTags and TerminateInstances, with EC2's
// error codes and HTTP statuses (400 for client errors, 503 for
// RequestLimitExceeded, 403 for UnauthorizedOperation). IMDSHandler serves
// IMDSv2. Faults adds latency, errors, throttling, IMDS and describe lag.
// Requests are not authenticated until SetIAM gives the account roles and
// OIDC providers (iam.go): then STS's AssumeRoleWithWebIdentity (sts.go,
// served by EC2Handler too) trades a verified ServiceAccount token for a
// role's credentials, IMDS serves the instance profile's, and EC2 checks
// every request's SigV4 signature and refuses what its role does not allow.
//
// The netns fabric mirrors the model through the Observer interface.
package vpcsim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Config describes the simulated VPC. The zero value gives the defaults.
type Config struct {
	Region  string       // default "us-west-2"
	VPCCIDR netip.Prefix // default 100.64.0.0/16
	// SecondaryVPCCIDRs are further IPv4 CIDR blocks associated with the VPC.
	SecondaryVPCCIDRs []netip.Prefix
	// VPCIPv6CIDR is the VPC's IPv6 CIDR block, a /56 as EC2 hands out
	// ("Amazon-provided IPv6 CIDR block"). Default: a /56 inside
	// 2600:1f14::/32, chosen by Seed (random when Seed is 0).
	VPCIPv6CIDR netip.Prefix
	// NoIPv6 leaves the VPC, and so every subnet, without an IPv6 CIDR.
	NoIPv6 bool
	// Subnets default to one /20 per availability zone a, b, c:
	// 100.64.0.0/20, 100.64.16.0/20, 100.64.32.0/20.
	Subnets []SubnetSpec
	// SecurityGroups are created besides the VPC's "default" group, which
	// every ENI created without SecurityGroupId.N gets.
	SecurityGroups []SecurityGroupSpec
	// DetachDelay is how long a DetachNetworkInterface stays "detaching"
	// before the ENI becomes "available". 0 detaches at once.
	DetachDelay time.Duration
	// AttachDelay is how long an AttachNetworkInterface stays "attaching"
	// before it is "attached" (and the fabric and IMDS see the ENI).
	// 0 attaches at once.
	AttachDelay time.Duration
	// Seed makes ids, MACs and tokens deterministic when non-zero (and
	// ScatterAddresses' choice).
	Seed int64
	// ScatterAddresses makes EC2's own choice of addresses (a count of
	// secondary addresses, a new ENI's primary) random among the subnet's
	// free addresses, instead of lowest first. EC2 documents no order; the
	// field's InsufficientCidrBlocks on subnets with thousands of free
	// addresses shows single addresses scattered over the aligned /28s.
	// Named addresses and /28 prefixes are unaffected.
	ScatterAddresses bool
	// Clock is the time the request-rate buckets refill by (Faults'
	// SetRequestLimits and SetThrottle); nil: time.Now. Tests set a fake
	// clock to measure refill exactly.
	Clock func() time.Time
}

// SubnetSpec is one subnet of the VPC.
type SubnetSpec struct {
	ID               string // optional; generated "subnet-" + 17 hex digits when empty
	CIDR             netip.Prefix
	AvailabilityZone string
	Tags             map[string]string
	// IPv6CIDR is the subnet's IPv6 CIDR block, a /64 of the VPC's /56.
	// Default: the lowest /64 of the VPC's /56 no earlier subnet has.
	IPv6CIDR netip.Prefix
	// NoIPv6 creates the subnet without an IPv6 CIDR block, as EC2 allows
	// in a VPC that has one: IPv6 assignments in it are refused.
	NoIPv6 bool
	// AssignIPv6OnCreation is EC2's subnet attribute
	// AssignIpv6AddressOnCreation: every ENI created in the subnet, an
	// instance's primary ENI included (when its type supports IPv6), gets
	// one IPv6 address of the /64, its primary IPv6 address. The fabric
	// puts it on the instance's eth0.
	AssignIPv6OnCreation bool
}

// SecurityGroupSpec is one security group of the VPC.
type SecurityGroupSpec struct {
	ID          string // optional; generated "sg-" + 17 hex digits when empty
	Name        string // required, unique in the VPC; "default" is taken
	Description string
	Tags        map[string]string
}

// InstanceInfo is a copy of one instance's model state.
type InstanceInfo struct {
	ID, Type, AvailabilityZone, SubnetID string
	PrimaryENI                           ENIInfo
	State                                string // "running" | "terminated"
}

// ENIInfo is a copy of one ENI's model state.
type ENIInfo struct {
	ID, MAC, SubnetID, Description string
	Status                         string // "available" | "in-use"
	InstanceID                     string
	DeviceIndex                    int
	NetworkCard                    int
	AttachmentID                   string
	AttachmentStatus               string // "attaching" | "attached" | "detaching" | ""
	PrimaryIP                      netip.Addr
	SecondaryIPs                   []netip.Addr   // in assignment order
	Prefixes                       []netip.Prefix // /28s, in assignment order
	IPv6Addresses                  []netip.Addr   // in assignment order
	IPv6Prefixes                   []netip.Prefix // /80s, in assignment order
	SubnetCIDR                     netip.Prefix
	Gateway                        netip.Addr // subnet network address + 1
	// SubnetIPv6CIDR is the subnet's /64; not valid when it has none.
	SubnetIPv6CIDR      netip.Prefix
	Tags                map[string]string
	DeleteOnTermination bool
	SecurityGroups      []string
}

// SubnetInfo is a copy of one subnet's model state.
type SubnetInfo struct {
	ID               string
	CIDR             netip.Prefix
	AvailabilityZone string
	FreeAddresses    int // EC2's AvailableIpAddressCount: not reserved, not held
	// FreePrefixes is how many aligned /28s of the subnet are entirely
	// free: what prefix assignments can still get before EC2 answers
	// InsufficientCidrBlocks. EC2 itself does not report it.
	FreePrefixes int
	// IPv6CIDR is the subnet's /64; not valid when it has none.
	IPv6CIDR netip.Prefix
	Tags     map[string]string
}

// Observer is told of every change the fabric must mirror, in order, after
// the model changed. It may be called with the model's lock held: it must not
// call back into the Cloud.
type Observer interface {
	// ENIAttached: also for the primary ENI at launch (device 0); eni.PrimaryIP is routed to it.
	ENIAttached(instanceID string, eni ENIInfo)
	// ENIDetached: all the ENI's routes go.
	ENIDetached(instanceID string, eniID string)
	// AddressesAssigned: /32 secondary IPs and /28 prefixes, /128 IPv6
	// addresses and /80 IPv6 prefixes (never both families in one call).
	AddressesAssigned(eniID string, p []netip.Prefix)
	// AddressesUnassigned: their routes go.
	AddressesUnassigned(eniID string, p []netip.Prefix)
	// InstanceTerminated: after ENIDetached for each of its ENIs.
	InstanceTerminated(instanceID string)
}

// AccountID is the owner id of every simulated resource.
const AccountID = "111122223333"

// Cloud is the simulated VPC. All its methods are safe for concurrent use.
type Cloud struct {
	cfg    Config
	faults *Faults

	mu        sync.Mutex // guards the fields below
	rnd       *rand.Rand // resource ids and MACs
	tokenRnd  *rand.Rand // request ids and IMDS tokens, apart so that ids depend only on changes
	vpc       *vpc
	subnets   map[string]*subnet
	subnetIDs []string // in creation order
	groups    map[string]*securityGroup
	instances map[string]*instance
	enis      map[string]*eni
	tokens    map[string]clientToken // CreateNetworkInterface ClientToken
	observer  Observer
	imds      imdsState
	iam       iamState // its own lock
	// eniHistory holds ENI snapshots while Faults.SetDescribeLag is set.
	eniHistory []eniSnapshot
}

type vpc struct {
	id    string
	cidrs []netip.Prefix
	ipv6  netip.Prefix // the /56; not valid without IPv6
	tags  map[string]string
}

type securityGroup struct {
	id, name, description string
	tags                  map[string]string
}

type instance struct {
	id, typ, subnetID, az string
	itype                 InstanceType
	state                 string
	launched              time.Time
	enis                  []*eni // attaching, attached or detaching; by device index
	tags                  map[string]string
}

type eni struct {
	id, mac, subnetID, description string
	primary                        netip.Addr
	secondaries                    []netip.Addr
	prefixes                       []netip.Prefix
	ipv6                           []netip.Addr   // IPv6 addresses
	ipv6Prefixes                   []netip.Prefix // /80s
	groups                         []string
	tags                           map[string]string
	// attachment; inst == nil when unattached
	inst             *instance
	attachmentID     string
	deviceIndex      int
	networkCard      int
	attachStatus     string // "attaching" | "attached" | "detaching"
	attachTime       time.Time
	deleteOnTerm     bool
	requesterManaged bool
}

type clientToken struct {
	eniID  string
	params string
}

// New builds a VPC from cfg, filling in defaults. It returns an error for an
// invalid layout (a subnet outside the VPC, overlapping subnets, a bad CIDR).
func New(cfg Config) (*Cloud, error) {
	loadTypes()
	if typesErr != nil {
		return nil, typesErr
	}
	cfg = withDefaults(cfg)
	c := &Cloud{
		cfg:       cfg,
		faults:    newFaults(cfg.Seed, cfg.Clock),
		subnets:   map[string]*subnet{},
		groups:    map[string]*securityGroup{},
		instances: map[string]*instance{},
		enis:      map[string]*eni{},
		tokens:    map[string]clientToken{},
	}
	if cfg.Seed != 0 {
		c.rnd = rand.New(rand.NewPCG(uint64(cfg.Seed), 0x76706373696d))
		c.tokenRnd = rand.New(rand.NewPCG(uint64(cfg.Seed), 0x746f6b656e))
	} else {
		c.rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		c.tokenRnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	c.faults.onDescribeLag = c.restartENIHistory
	if err := c.buildVPC(cfg); err != nil {
		return nil, err
	}
	c.imds.init()
	return c, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Region == "" {
		cfg.Region = "us-west-2"
	}
	if !cfg.VPCCIDR.IsValid() {
		cfg.VPCCIDR = netip.MustParsePrefix("100.64.0.0/16")
	}
	if len(cfg.Subnets) == 0 && cfg.VPCCIDR.Addr().Is4() {
		for i, az := range []string{"a", "b", "c"} {
			base := cfg.VPCCIDR.Addr().As4()
			base[2] += byte(16 * i)
			p := netip.PrefixFrom(netip.AddrFrom4(base), 20)
			if cfg.VPCCIDR.Bits() > 20 || !cfg.VPCCIDR.Contains(p.Addr()) {
				break
			}
			cfg.Subnets = append(cfg.Subnets, SubnetSpec{CIDR: p, AvailabilityZone: cfg.Region + az})
		}
	}
	return cfg
}

func (c *Cloud) buildVPC(cfg Config) error {
	cidrs := append([]netip.Prefix{cfg.VPCCIDR}, cfg.SecondaryVPCCIDRs...)
	for i, p := range cidrs {
		if !p.IsValid() || !p.Addr().Is4() || p.Masked() != p || p.Bits() < 16 || p.Bits() > 28 {
			return fmt.Errorf("vpcsim: VPC CIDR %s: want an IPv4 network between /16 and /28", p)
		}
		for _, q := range cidrs[:i] {
			if p.Overlaps(q) {
				return fmt.Errorf("vpcsim: VPC CIDRs %s and %s overlap", q, p)
			}
		}
	}
	c.vpc = &vpc{id: c.newIDLocked("vpc"), cidrs: cidrs, tags: map[string]string{}}
	if err := c.setVPCIPv6(cfg); err != nil {
		return err
	}
	sg := &securityGroup{id: c.newIDLocked("sg"), name: "default", description: "default VPC security group", tags: map[string]string{}}
	c.groups[sg.id] = sg
	for _, g := range cfg.SecurityGroups {
		if err := c.addGroup(g); err != nil {
			return err
		}
	}
	if len(cfg.Subnets) == 0 {
		return errors.New("vpcsim: no subnets")
	}
	for _, s := range cfg.Subnets {
		if err := c.addSubnet(s); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cloud) addSubnet(s SubnetSpec) error {
	p := s.CIDR
	if !p.IsValid() || !p.Addr().Is4() || p.Masked() != p || p.Bits() < 16 || p.Bits() > 28 {
		return fmt.Errorf("vpcsim: subnet %s: want an IPv4 network between /16 and /28", p)
	}
	inVPC := false
	for _, v := range c.vpc.cidrs {
		inVPC = inVPC || (v.Contains(p.Addr()) && v.Bits() <= p.Bits())
	}
	if !inVPC {
		return fmt.Errorf("vpcsim: subnet %s is outside the VPC's CIDRs", p)
	}
	for _, id := range c.subnetIDs {
		if c.subnets[id].cidr.Overlaps(p) {
			return fmt.Errorf("vpcsim: subnets %s and %s overlap", c.subnets[id].cidr, p)
		}
	}
	if s.AvailabilityZone == "" {
		s.AvailabilityZone = c.cfg.Region + "a"
	}
	id := s.ID
	if id == "" {
		id = c.newIDLocked("subnet")
	}
	if _, dup := c.subnets[id]; dup {
		return fmt.Errorf("vpcsim: duplicate subnet id %s", id)
	}
	sub := newSubnet(id, p, s.AvailabilityZone, s.Tags)
	if err := c.setSubnetIPv6(sub, s); err != nil {
		return err
	}
	c.subnets[id] = sub
	if c.cfg.ScatterAddresses {
		seed := uint64(c.cfg.Seed)
		if seed == 0 {
			seed = rand.Uint64()
		}
		c.subnets[id].scatter = rand.New(rand.NewPCG(seed, uint64(len(c.subnetIDs))))
	}
	c.subnetIDs = append(c.subnetIDs, id)
	return nil
}

func (c *Cloud) addGroup(g SecurityGroupSpec) error {
	if g.Name == "" {
		return errors.New("vpcsim: security group without a name")
	}
	id := g.ID
	if id == "" {
		id = c.newIDLocked("sg")
	}
	if !strings.HasPrefix(id, "sg-") {
		return fmt.Errorf("vpcsim: security group id %q: want sg-...", id)
	}
	for _, other := range c.groups {
		if other.id == id || other.name == g.Name {
			return fmt.Errorf("vpcsim: duplicate security group %s (%s)", id, g.Name)
		}
	}
	c.groups[id] = &securityGroup{id: id, name: g.Name, description: g.Description, tags: copyTags(g.Tags)}
	return nil
}

// newIDLocked returns kind + "-" + 17 hex digits, EC2's long id form.
func (c *Cloud) newIDLocked(kind string) string {
	return fmt.Sprintf("%s-%017x", kind, c.rnd.Uint64())
}

// newMACLocked returns a locally administered unicast MAC not used by any ENI.
func (c *Cloud) newMACLocked() string {
	for {
		v := c.rnd.Uint64()
		mac := fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		dup := false
		for _, e := range c.enis {
			dup = dup || e.mac == mac
		}
		if !dup {
			return mac
		}
	}
}

// SetObserver installs the fabric (nil = none). Later changes are reported to it.
func (c *Cloud) SetObserver(o Observer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observer = o
}

// Faults returns the fault injector of this cloud.
func (c *Cloud) Faults() *Faults { return c.faults }

// Region is the region the cloud simulates.
func (c *Cloud) Region() string { return c.cfg.Region }

// VPCID returns the id of the simulated VPC.
func (c *Cloud) VPCID() string { return c.vpc.id }

// VPCIPv6CIDR returns the VPC's IPv6 CIDR block (a /56), or an invalid
// prefix when the VPC has none (Config.NoIPv6).
func (c *Cloud) VPCIPv6CIDR() netip.Prefix { return c.vpc.ipv6 }

// VPCCIDRs returns the VPC's IPv4 CIDR blocks, primary first.
func (c *Cloud) VPCCIDRs() []netip.Prefix {
	return append([]netip.Prefix(nil), c.vpc.cidrs...)
}
