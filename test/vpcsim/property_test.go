package vpcsim_test

import (
	"encoding/xml"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// propertyConfig is a VPC of small subnets, so random sequences run into
// exhaustion and fragmentation.
func propertyConfig(seed int64) vpcsim.Config {
	return vpcsim.Config{Seed: seed, Subnets: []vpcsim.SubnetSpec{
		{ID: "subnet-00000000000000001", CIDR: netip.MustParsePrefix("100.64.0.0/26"), AvailabilityZone: "us-west-2a"},
		{ID: "subnet-00000000000000002", CIDR: netip.MustParsePrefix("100.64.0.64/27"), AvailabilityZone: "us-west-2a"},
		{ID: "subnet-00000000000000003", CIDR: netip.MustParsePrefix("100.64.1.0/25"), AvailabilityZone: "us-west-2b"},
	}}
}

// refusalsAllowed are the codes a random but well-formed call may get.
var refusalsAllowed = []string{
	"AttachmentLimitExceeded", "PrivateIpAddressLimitExceeded", "InsufficientFreeAddressesInSubnet",
	"InsufficientCidrBlocks", "InvalidParameterValue", "InvalidNetworkInterface.InUse",
	"InvalidNetworkInterfaceID.NotFound", "InvalidInstanceID.NotFound", "IncorrectInstanceState",
	"OperationNotPermitted", "InvalidAttachmentID.NotFound", "InvalidParameterCombination",
}

// TestPropertyRandomSequences drives random create/attach/assign/unassign/
// detach/delete/terminate sequences through the EC2 handler and checks the
// model's invariants after every step.
func TestPropertyRandomSequences(t *testing.T) {
	seeds, steps := 12, 250
	if testing.Short() {
		seeds, steps = 3, 100
	}
	outcomes := map[string]int{} // "Action" or "Action/Code"
	defer func() {
		t.Logf("outcomes: %v", outcomes)
		if testing.Short() {
			return
		}
		// The sequences must reach success of every action and the
		// capacity refusals, or they prove little.
		for _, want := range []string{
			"CreateNetworkInterface", "AttachNetworkInterface", "AssignPrivateIpAddresses",
			"UnassignPrivateIpAddresses", "DetachNetworkInterface", "DeleteNetworkInterface",
			"AttachNetworkInterface/AttachmentLimitExceeded", "AssignPrivateIpAddresses/PrivateIpAddressLimitExceeded",
			"AssignPrivateIpAddresses/InsufficientCidrBlocks", "CreateNetworkInterface/InsufficientFreeAddressesInSubnet",
		} {
			if outcomes[want] == 0 {
				t.Errorf("no random call ended in %s; outcomes: %v", want, outcomes)
			}
		}
	}()
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			c, err := vpcsim.New(propertyConfig(int64(seed + 1)))
			if err != nil {
				t.Fatal(err)
			}
			h := c.EC2Handler()
			rnd := rand.New(rand.NewPCG(uint64(seed), 99))
			var insts []string
			for _, typ := range []string{"m5.large", "t3.nano", "m4.large", "m5.large"} {
				inst, err := c.LaunchInstance(typ, subnetOf(rnd, c))
				if err != nil {
					t.Fatal(err)
				}
				insts = append(insts, inst.ID)
			}
			checkInvariants(t, c)
			for step := range steps {
				form := randomCall(rnd, c, insts)
				before := c.NetworkInterfaces()
				code := callHandler(h, form)
				if code == "" {
					outcomes[form.Get("Action")]++
				} else {
					outcomes[form.Get("Action")+"/"+code]++
				}
				if code != "" {
					if !slices.Contains(refusalsAllowed, code) {
						t.Fatalf("step %d %v: unexpected error %s", step, form, code)
					}
					if diff := fmt.Sprint(c.NetworkInterfaces()); diff != fmt.Sprint(before) {
						t.Fatalf("step %d %v refused with %s but changed the model", step, form, code)
					}
				}
				if err := invariants(c); err != nil {
					t.Fatalf("step %d %v (%s): %v", step, form, code, err)
				}
				for i, id := range insts {
					if inst, _ := c.Instance(id); inst.State == "terminated" {
						// A replacement keeps the instance mix; it may not fit a full subnet.
						if n, err := c.LaunchInstance(inst.Type, subnetOf(rnd, c)); err == nil {
							insts[i] = n.ID
						}
					}
				}
			}
		})
	}
}

func checkInvariants(t *testing.T, c *vpcsim.Cloud) {
	t.Helper()
	if err := invariants(c); err != nil {
		t.Fatal(err)
	}
}

// invariants checks: no address held twice in the VPC; every held address in
// its ENI's subnet and not reserved; subnet free counts exact; per-ENI and
// per-instance limits respected; prefixes aligned /28s, only on types that
// allow them.
func invariants(c *vpcsim.Cloud) error {
	held := map[netip.Addr]string{}
	perSubnet := map[string]int{}
	hold := func(a netip.Addr, e vpcsim.ENIInfo) error {
		if other, dup := held[a]; dup {
			return fmt.Errorf("address %s held by %s and %s", a, other, e.ID)
		}
		held[a] = e.ID
		s, _ := c.Subnet(e.SubnetID)
		if !s.CIDR.Contains(a) {
			return fmt.Errorf("%s of %s outside subnet %s", a, e.ID, s.CIDR)
		}
		off := int(u32(a) - u32(s.CIDR.Addr()))
		size := 1 << (32 - s.CIDR.Bits())
		if off < 4 || off == size-1 {
			return fmt.Errorf("%s of %s is reserved in %s", a, e.ID, s.CIDR)
		}
		perSubnet[e.SubnetID]++
		return nil
	}
	perInstance := map[string][]vpcsim.ENIInfo{}
	for _, e := range c.NetworkInterfaces() {
		if err := hold(e.PrimaryIP, e); err != nil {
			return err
		}
		for _, a := range e.SecondaryIPs {
			if err := hold(a, e); err != nil {
				return err
			}
		}
		for _, p := range e.Prefixes {
			if p.Bits() != 28 || p.Masked() != p {
				return fmt.Errorf("prefix %s of %s not an aligned /28", p, e.ID)
			}
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				if err := hold(a, e); err != nil {
					return err
				}
			}
		}
		if e.InstanceID != "" {
			perInstance[e.InstanceID] = append(perInstance[e.InstanceID], e)
		}
	}
	for _, s := range c.Subnets() {
		size := 1 << (32 - s.CIDR.Bits())
		if want := size - 5 - perSubnet[s.ID]; s.FreeAddresses != want {
			return fmt.Errorf("subnet %s: %d free, want %d", s.ID, s.FreeAddresses, want)
		}
	}
	for id, enis := range perInstance {
		inst, _ := c.Instance(id)
		it, _ := vpcsim.LookupInstanceType(inst.Type)
		if len(enis) > it.MaxENIs || len(enis) > it.CardENIs[0] {
			return fmt.Errorf("instance %s (%s) has %d ENIs", id, inst.Type, len(enis))
		}
		devices := map[int]bool{}
		for _, e := range enis {
			if devices[e.DeviceIndex] {
				return fmt.Errorf("instance %s: device index %d twice", id, e.DeviceIndex)
			}
			devices[e.DeviceIndex] = true
			if n := 1 + len(e.SecondaryIPs) + len(e.Prefixes); n > it.IPv4PerENI {
				return fmt.Errorf("ENI %s on %s holds %d slots, limit %d", e.ID, inst.Type, n, it.IPv4PerENI)
			}
			if len(e.Prefixes) > 0 && !it.PrefixDelegation() {
				return fmt.Errorf("ENI %s on %s holds prefixes", e.ID, inst.Type)
			}
		}
	}
	return nil
}

func subnetOf(rnd *rand.Rand, c *vpcsim.Cloud) string {
	s := c.Subnets()
	return s[rnd.IntN(len(s))].ID
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// randomCall builds one well-formed EC2 request. Most calls target objects
// that make sense (an available ENI in the instance's zone, an attached
// secondary ENI), the rest any object, so both successes and refusals come.
func randomCall(rnd *rand.Rand, c *vpcsim.Cloud, insts []string) url.Values {
	enis := c.NetworkInterfaces()
	subnets := c.Subnets()
	pick := func(ok func(vpcsim.ENIInfo) bool) vpcsim.ENIInfo {
		var cand []vpcsim.ENIInfo
		for _, e := range enis {
			if rnd.IntN(5) == 0 || ok(e) {
				cand = append(cand, e)
			}
		}
		if len(cand) == 0 {
			return vpcsim.ENIInfo{ID: "eni-0123456789abcdef0", AttachmentID: "eni-attach-0123456789abcdef0"}
		}
		return cand[rnd.IntN(len(cand))]
	}
	any := func(vpcsim.ENIInfo) bool { return true }
	v := url.Values{"Version": {"2016-11-15"}}
	switch op := rnd.IntN(40); {
	case op < 6:
		v.Set("Action", "CreateNetworkInterface")
		v.Set("SubnetId", subnets[rnd.IntN(len(subnets))].ID)
		if n := rnd.IntN(4); n > 0 {
			v.Set("SecondaryPrivateIpAddressCount", fmt.Sprint(n))
		}
	case op < 13:
		inst, _ := c.Instance(insts[rnd.IntN(len(insts))])
		e := pick(func(e vpcsim.ENIInfo) bool {
			s, _ := c.Subnet(e.SubnetID)
			return e.Status == "available" && s.AvailabilityZone == inst.AvailabilityZone
		})
		v.Set("Action", "AttachNetworkInterface")
		v.Set("NetworkInterfaceId", e.ID)
		v.Set("InstanceId", inst.ID)
		v.Set("DeviceIndex", fmt.Sprint(1+rnd.IntN(3)))
	case op < 22:
		e := pick(any)
		v.Set("Action", "AssignPrivateIpAddresses")
		v.Set("NetworkInterfaceId", e.ID)
		switch rnd.IntN(3) {
		case 0:
			v.Set("SecondaryPrivateIpAddressCount", fmt.Sprint(1+rnd.IntN(6)))
		case 1:
			v.Set("Ipv4PrefixCount", fmt.Sprint(1+rnd.IntN(2)))
		default:
			if e.SubnetCIDR.IsValid() {
				a := e.SubnetCIDR.Addr().As4()
				a[3] += byte(rnd.IntN(1 << (32 - e.SubnetCIDR.Bits())))
				v.Set("PrivateIpAddress.1", netip.AddrFrom4(a).String())
			}
		}
	case op < 29:
		e := pick(func(e vpcsim.ENIInfo) bool { return len(e.SecondaryIPs)+len(e.Prefixes) > 0 })
		v.Set("Action", "UnassignPrivateIpAddresses")
		v.Set("NetworkInterfaceId", e.ID)
		if len(e.Prefixes) > 0 && rnd.IntN(2) == 0 {
			v.Set("Ipv4Prefix.1", e.Prefixes[rnd.IntN(len(e.Prefixes))].String())
		} else if len(e.SecondaryIPs) > 0 {
			for i, a := range e.SecondaryIPs[:1+rnd.IntN(len(e.SecondaryIPs))] {
				v.Set(fmt.Sprintf("PrivateIpAddress.%d", i+1), a.String())
			}
		} else {
			v.Set("PrivateIpAddress.1", e.PrimaryIP.String())
		}
	case op < 34:
		e := pick(func(e vpcsim.ENIInfo) bool { return e.DeviceIndex > 0 })
		v.Set("Action", "DetachNetworkInterface")
		v.Set("AttachmentId", e.AttachmentID)
		if e.AttachmentID == "" {
			v.Set("AttachmentId", "eni-attach-0123456789abcdef0")
		}
	case op < 39:
		v.Set("Action", "DeleteNetworkInterface")
		v.Set("NetworkInterfaceId", pick(func(e vpcsim.ENIInfo) bool { return e.Status == "available" }).ID)
	default:
		v.Set("Action", "TerminateInstances")
		v.Set("InstanceId.1", insts[rnd.IntN(len(insts))])
	}
	return v
}

// callHandler posts the form to h and returns the EC2 error code ("" on success).
func callHandler(h http.Handler, form url.Values) string {
	req := httptest.NewRequest("POST", "/", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code == http.StatusOK {
		return ""
	}
	var e struct {
		Code string `xml:"Errors>Error>Code"`
	}
	if err := xml.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
		return fmt.Sprintf("unparsable error reply (HTTP %d): %q", rec.Code, rec.Body.String())
	}
	return e.Code
}
