package ipamd

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// ipv6Env is the AWS VPC CNI's IPv6 mode, with every periodic loop of the
// worker due many times during a test: a pool cycle, a resync or a sweep
// that called EC2 would show in the counts.
func ipv6Env() map[string]string {
	return map[string]string{
		"ENABLE_IPv6": "true", "ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true",
		"VPCIP_POOL_INTERVAL": "10ms", "VPCIP_RECONCILE_INTERVAL": "20ms",
		"VPCIP_RESYNC_INTERVAL": "20ms", "VPCIP_LEAK_SWEEP_INTERVAL": "20ms",
	}
}

// ec2Calls is every EC2 API request vpcsim received, by action (IMDS GETs
// left out: they are not EC2 calls and cost no request budget).
func ec2Calls(c cloud) map[string]int {
	out := c.Cloud.Faults().CallCounts()
	delete(out, vpcsim.IMDSOp)
	return out
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// primaryV6 is what vpcsim shows on the node's primary ENI: its /80s.
func (n *node) primaryV6() []netip.Prefix {
	n.t.Helper()
	for _, e := range n.cloud.Cloud.NetworkInterfaces() {
		if e.ID == n.inst.PrimaryENI.ID {
			return e.IPv6Prefixes
		}
	}
	n.t.Fatalf("vpcsim has no ENI %s", n.inst.PrimaryENI.ID)
	return nil
}

// TestIPv6ModeOnePrefixThenNoEC2Call is issue #30's done-when: a node in
// IPv6 mode takes one /80 on its primary ENI, gives 100 pods distinct
// addresses from it, and makes no EC2 call after that /80 (pool cycles,
// reconciliation, resync and leak sweep all due many times meanwhile), nor
// across a restart, which finds the same /80 and the same assignments.
func TestIPv6ModeOnePrefixThenNoEC2Call(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, ipv6Env())
	host := newMemHost()
	n.host = host
	n.start()

	pfx := n.primaryV6()
	if len(pfx) != 1 || pfx[0].Bits() != 80 {
		t.Fatalf("primary ENI holds IPv6 prefixes %v, want one /80", pfx)
	}
	if got := c.Cloud.Faults().Calls("AssignIpv6Addresses"); got != 1 {
		t.Errorf("AssignIpv6Addresses called %d times at start-up, want 1", got)
	}
	before := ec2Calls(c)
	t.Logf("EC2 calls up to the first /80: %d %v", total(before), before)
	host.mu.Lock()
	acceptRA := slices.Clone(host.acceptRA)
	host.mu.Unlock()
	if len(acceptRA) == 0 || acceptRA[0] != "eth0" {
		t.Errorf("accept_ra=2 set on %v at start, want the primary ENI's link eth0 (IPv6 forwarding would drop its RA routes)", acceptRA)
	}

	subnet6 := c.Cloud.Subnets()[0].IPv6CIDR
	seen := map[netip.Addr]string{}
	for _, id := range names("v6-", 100) {
		a := n.mustAdd(id)
		switch {
		case !a.Address.Is6() || !pfx[0].Contains(a.Address):
			t.Fatalf("ADD(%s) = %s, want an address of %s", id, a.Address, pfx[0])
		case seen[a.Address] != "":
			t.Fatalf("ADD(%s) = %s, already given to %s", id, a.Address, seen[a.Address])
		case a.ENIID != n.inst.PrimaryENI.ID || a.DeviceNumber != 0 || a.RouteTable != 0:
			t.Fatalf("ADD(%s) on ENI %s device %d table %d, want the primary ENI, main table", id, a.ENIID, a.DeviceNumber, a.RouteTable)
		case a.SubnetCIDR != subnet6 || len(a.VPCCIDRs) != 1 || a.VPCCIDRs[0] != c.Cloud.VPCIPv6CIDR():
			t.Fatalf("ADD(%s): subnet %s, VPC %v; want the subnet's /64 %s and the VPC's /56 %s", id, a.SubnetCIDR, a.VPCCIDRs, subnet6, c.Cloud.VPCIPv6CIDR())
		}
		seen[a.Address] = id
	}
	again := n.mustAdd("v6-7")
	if seen[again.Address] != "v6-7" {
		t.Errorf("ADD(v6-7) again = %s, want its first answer", again.Address)
	}
	for _, id := range names("v6-", 10) {
		n.del(id)
	}
	n.clock.Advance(time.Hour) // past the cooldown: released addresses may be reused
	for _, id := range names("w6-", 10) {
		a := n.mustAdd(id)
		if h, ok := n.d.store.Holder(a.Address); !ok || h.Key != key(id) {
			t.Fatalf("ADD(%s) = %s, held by %v", id, a.Address, h.Key)
		}
	}
	time.Sleep(300 * time.Millisecond) // 30 pool intervals, 15 of each other loop
	n.cycle()
	n.reconcile()

	st := n.status()
	if !st.Ready || st.Assigned != 100 || st.ENIs != 1 || st.Capacity != 1<<48-1 || st.Warm != st.Capacity-100-st.Cooling {
		t.Errorf("status = %+v, want ready, 100 assigned on one ENI of capacity 2^48-1", st)
	}
	if err := st.Counts.Check(); err != nil {
		t.Errorf("status counts: %v", err)
	}
	if after := ec2Calls(c); !maps.Equal(after, before) {
		t.Errorf("EC2 calls after the first /80: %d (%v), before the pods %d (%v); want none", total(after), after, total(before), before)
	}
	checkIPv6Views(t, n, pfx[0], 100)

	// A restart finds the /80 instead of assigning another, and the
	// checkpoint gives every pod its address back.
	held := map[api.Key]netip.Addr{}
	for _, a := range n.d.store.Assignments() {
		held[a.Key] = a.Address
	}
	n.restart()
	if got := n.primaryV6(); len(got) != 1 || got[0] != pfx[0] {
		t.Errorf("after restart the primary ENI holds %v, want %v", got, pfx)
	}
	if got := c.Cloud.Faults().Calls("AssignIpv6Addresses"); got != 1 {
		t.Errorf("AssignIpv6Addresses called %d times after a restart, want still 1", got)
	}
	for k, addr := range held {
		a, ok := n.d.store.Get(k)
		if !ok || a.Address != addr || a.ENIID != n.inst.PrimaryENI.ID {
			t.Errorf("after restart %s holds %v (%v), want %s on the primary ENI", k, a.Address, ok, addr)
		}
	}
	fresh := n.mustAdd("after-restart")
	if h, ok := n.d.store.Holder(fresh.Address); !ok || h.Key != key("after-restart") || !pfx[0].Contains(fresh.Address) {
		t.Errorf("ADD after restart = %s: not a fresh address of %s", fresh.Address, pfx[0])
	}
	before = ec2Calls(c)
	time.Sleep(200 * time.Millisecond)
	n.cycle()
	if after := ec2Calls(c); !maps.Equal(after, before) {
		t.Errorf("EC2 calls after the restart's start-up: %v, then %v; want none", before, after)
	}
}

// waitExit waits for a daemon that must stop by itself and returns its error.
func (n *node) waitExit() error {
	n.t.Helper()
	select {
	case err := <-n.done:
		n.stop = nil
		return err
	case <-time.After(20 * time.Second):
		n.t.Fatalf("daemon did not stop; status %q", n.d.Status().Reason)
		return nil
	}
}

// TestIPv6ModeRefusesNodesThatCannotServeIt: a subnet without an IPv6 CIDR
// block and an instance type without prefix delegation stop the daemon at
// start-up, naming the subnet or type, before any IPv6 call to EC2.
func TestIPv6ModeRefusesNodesThatCannotServeIt(t *testing.T) {
	tests := []struct {
		name   string
		subnet vpcsim.SubnetSpec
		itype  string
		want   []string
	}{
		{"subnet without IPv6", vpcsim.SubnetSpec{ID: "subnet-000000000000000b1", CIDR: netip.MustParsePrefix("100.64.0.0/24"),
			AvailabilityZone: "us-west-2a", NoIPv6: true}, itypeSmall, []string{"ENABLE_IPv6", "subnet-000000000000000b1", "no IPv6 CIDR block"}},
		{"type without prefix delegation", vpcsim.SubnetSpec{ID: "subnet-000000000000000b2", CIDR: netip.MustParsePrefix("100.64.0.0/24"),
			AvailabilityZone: "us-west-2a"}, "c4.large", []string{"ENABLE_IPv6", "c4.large", "prefix delegation"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startCloud(t, tt.subnet)
			n := newNode(t, c, tt.itype, ipv6Env())
			n.startNoWait()
			err := n.waitExit()
			if err == nil {
				t.Fatal("daemon Run returned nil, want the start-up error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run error %q does not name %q", err, w)
				}
			}
			if got := c.Cloud.Faults().Calls("AssignIpv6Addresses"); got != 0 {
				t.Errorf("AssignIpv6Addresses called %d times, want none", got)
			}
			if len(n.primaryV6()) != 0 {
				t.Errorf("the primary ENI holds IPv6 prefixes %v", n.primaryV6())
			}
		})
	}
}

// lyingSubnet is a provider whose instance metadata claims an IPv6 CIDR
// block for a subnet EC2 knows without one: EC2's refusal must reach the
// status, and the daemon keeps retrying (it is not ready) rather than serve.
type lyingSubnet struct {
	provider.Provider
	provider.IPv6Assigner
}

func (l lyingSubnet) Self(ctx context.Context) (provider.Instance, error) {
	self, err := l.Provider.Self(ctx)
	self.SubnetIPv6CIDR = netip.MustParsePrefix("2600:1f14:1:2::/64")
	return self, err
}

// TestIPv6ModeShowsEC2Refusal: when EC2 itself refuses the /80 (here: the
// subnet has no IPv6 CIDR block although metadata said otherwise), the
// daemon stays not ready with EC2's message and serves no ADD.
func TestIPv6ModeShowsEC2Refusal(t *testing.T) {
	c := startCloud(t, vpcsim.SubnetSpec{ID: "subnet-000000000000000b3", CIDR: netip.MustParsePrefix("100.64.0.0/24"),
		AvailabilityZone: "us-west-2a", NoIPv6: true})
	n := newNode(t, c, itypeSmall, ipv6Env())
	n.wrap = func(p provider.Provider) provider.Provider { return lyingSubnet{p, p.(provider.IPv6Assigner)} }
	n.startNoWait()
	eventually(t, "EC2's refusal in the status", func() bool {
		r := n.d.Status().Reason
		return strings.Contains(r, "AssignIpv6Addresses") && strings.Contains(r, "no IPv6 CIDR block")
	})
	if n.d.Status().Ready {
		t.Error("daemon ready without a /80")
	}
	_, err := n.add("x")
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Errorf("ADD without a /80 = %v, want the daemon's refusal", err)
	}
}

// checkIPv6Views: introspection (what vpcipctl prints) and the metrics
// speak the /80 and its pods' IPv6 addresses.
func checkIPv6Views(t *testing.T, n *node, pfx netip.Prefix, pods int) {
	t.Helper()
	st := n.d.State()
	if st.Node.Mode != introspect.ModeIPv6Prefix {
		t.Errorf("introspection mode %q, want %q", st.Node.Mode, introspect.ModeIPv6Prefix)
	}
	if len(st.ENIs) != 1 || len(st.ENIs[0].Prefixes) != 1 || st.ENIs[0].Prefixes[0] != pfx || st.ENIs[0].Capacity != 1<<48-1 {
		t.Errorf("introspection ENIs %+v, want the primary with %s, capacity 2^48-1", st.ENIs, pfx)
	}
	if len(st.Assignments) != pods {
		t.Errorf("introspection lists %d assignments, want %d", len(st.Assignments), pods)
	}
	for _, a := range st.Assignments {
		if !pfx.Contains(a.Address) {
			t.Errorf("introspection: %s holds %s, outside %s", a.Key, a.Address, pfx)
		}
	}
	if got := gaugeInt(t, n.reg, "vpcip_addresses_assigned"); got != pods {
		t.Errorf("vpcip_addresses_assigned = %d, want %d", got, pods)
	}
	if got := gaugeInt(t, n.reg, "vpcip_addresses_capacity"); got != 1<<48-1 {
		t.Errorf("vpcip_addresses_capacity = %d, want 2^48-1", got)
	}
}
