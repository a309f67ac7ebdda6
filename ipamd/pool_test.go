package ipamd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// trim advances the clock past the cooldown and release interval and runs a
// pool cycle, n times, checking the invariants after each.
func (n *node) trim(times int) {
	n.t.Helper()
	for range times {
		n.clock.Advance(31 * time.Second)
		n.cycle()
		n.checkInvariants()
	}
}

// TestB09PoolShrinksAfterBurst: after 25 pods come and 24 go, the pool
// returns to max(WARM_IP_TARGET, MINIMUM_IP_TARGET − assigned) free addresses
// within a few release intervals, and the emptied ENIs are deleted.
func TestB09PoolShrinksAfterBurst(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "2", "MINIMUM_IP_TARGET": "3", "IP_COOLDOWN_PERIOD": "30"})
	n.start()
	pods := names("c", 25)
	for _, id := range pods {
		n.mustAdd(id)
	}
	if st := n.status(); st.ENIs != 3 || st.Assigned != 25 {
		t.Fatalf("after the burst: %+v, want 25 assigned on 3 ENIs", st)
	}
	for _, id := range pods[1:] {
		n.del(id)
	}
	// The burst's pods ran for a while: its ENIs are past VPCIP_ENI_MIN_AGE,
	// so the bound below is about release intervals alone.
	n.clock.Advance(time.Minute)
	n.trim(3) // documented bound: k+1 intervals for k surplus ENIs
	n.checkMirror()
	st := n.status()
	if st.Warm != 2 || st.Cooling != 0 || st.ENIs != 1 || st.Assigned != 1 {
		t.Errorf("after trimming: %+v, want 1 assigned, 2 warm on the primary ENI only", st)
	}
	if got := len(n.cloudAddrs()); got != 3 {
		t.Errorf("cloud holds %d addresses for the node, want 3", got)
	}
	if c.Cloud.Faults().Calls("DeleteNetworkInterface") != 2 {
		t.Errorf("%d ENIs deleted, want the 2 emptied ones", c.Cloud.Faults().Calls("DeleteNetworkInterface"))
	}

	// Variant: restart with WARM_IP_TARGET lowered from 10 to 2.
	n.env = map[string]string{"WARM_IP_TARGET": "10"}
	n.restart()
	if st := n.status(); st.Warm < 10 {
		t.Fatalf("WARM_IP_TARGET=10: %d warm", st.Warm)
	}
	n.env = map[string]string{"WARM_IP_TARGET": "2"}
	n.restart()
	n.trim(4)
	if st := n.status(); st.Warm != 2 {
		t.Errorf("after lowering WARM_IP_TARGET to 2: %d warm", st.Warm)
	}
}

// TestB10CooldownIsNotFree: cooling addresses are not counted as free, so
// the pool grows and churn never gets "no address" while the cloud has room.
func TestB10CooldownIsNotFree(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "2", "MINIMUM_IP_TARGET": "8",
		"WARM_ENI_TARGET": "0", "IP_COOLDOWN_PERIOD": "30", "VPCIP_ADD_WAIT": "10s"})
	n.start()
	for _, id := range names("a", 6) {
		n.mustAdd(id)
	}
	for _, id := range names("a", 4) {
		n.del(id)
	}
	n.clock.Advance(2 * time.Second)
	st := n.status()
	if st.Cooling != 4 || !st.Ready {
		t.Fatalf("status %+v, want 4 cooling, ready", st)
	}
	for _, id := range names("b", 4) {
		if _, err := n.add(id); err != nil {
			t.Fatalf("ADD(%s) during churn: %v", id, err)
		}
	}
	if st := n.status(); st.Assigned != 6 || st.Cooling != 4 || !st.Ready {
		t.Errorf("after churn: %+v", st)
	}
	n.checkInvariants()
}

// TestB20FragmentedSubnetFallsBackToAddresses: in prefix mode, a subnet with
// free addresses but no aligned free /28 gives a distinct reason and falls
// back to secondary addresses in the same cycle, without a retry storm.
func TestB20FragmentedSubnetFallsBackToAddresses(t *testing.T) {
	c := startCloud(t, vpcsim.SubnetSpec{CIDR: netip.MustParsePrefix("100.64.0.0/26"), AvailabilityZone: "us-west-2a"})
	n := newNode(t, c, itypeSmall, map[string]string{"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "1"})
	raw := c.raw(t, n.inst.ID)
	eni := createAvailableENI(t, raw, n.inst.SubnetID, nil)
	if _, err := raw.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: []string{"100.64.0.20", "100.64.0.40"}}); err != nil {
		t.Fatal(err)
	}
	n.start()
	for _, id := range names("c", 3) {
		n.mustAdd(id)
	}
	st := n.status()
	if !strings.Contains(st.Reason, "no contiguous /28 in subnet "+n.inst.SubnetID) {
		t.Errorf("status reason %q does not name the missing /28", st.Reason)
	}
	prefixTries := counter(t, n, "vpcip_provider_calls_total", map[string]string{"operation": "AssignPrivateIpAddresses", "outcome": "error"})
	for range 5 {
		n.cycle()
	}
	if got := counter(t, n, "vpcip_provider_calls_total", map[string]string{"operation": "AssignPrivateIpAddresses", "outcome": "error"}); got != prefixTries {
		t.Errorf("refused prefix calls went from %v to %v within the backoff", prefixTries, got)
	}
	for _, e := range n.d.store.ENIs() {
		for _, s := range e.Slots {
			if s.Bits() != 32 {
				t.Errorf("slot %s is not a /32", s)
			}
		}
	}
	n.checkInvariants()
}

// TestB23ReleaseNeverRacesAllocation: with the pool releasing surplus while
// pods come and go and UnassignPrivateIpAddresses taking 200 ms, no address
// is handed out while its unassign is pending or done.
func TestB23ReleaseNeverRacesAllocation(t *testing.T) {
	c := startCloud(t)
	c.Cloud.Faults().SetLatency("UnassignPrivateIpAddresses", 200*time.Millisecond, 0)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "1", "IP_COOLDOWN_PERIOD": "0",
		"VPCIP_RELEASE_INTERVAL": "1ms", "VPCIP_ADD_WAIT": "10s"})
	n.start()
	// Checked at every unassign the cloud makes: no address it takes away
	// is held by a pod in the datastore.
	watch := &unassignWatch{n: n}
	c.Cloud.SetObserver(watch)
	defer c.Cloud.SetObserver(nil)
	for i := range 15 {
		up := names(fmt.Sprintf("r%d-", i), 10)
		for _, id := range up {
			a := n.mustAdd(id)
			if eni, ok := n.cloudAddrs()[a.Address]; !ok || eni != a.ENIID {
				t.Fatalf("ADD(%s) got %s, which the cloud does not show on %s", id, a.Address, a.ENIID)
			}
		}
		n.clock.Advance(time.Second)
		for _, id := range up[5:] {
			n.del(id)
		}
		n.d.Kick()
		n.checkInvariants()
		for _, id := range up[:5] {
			n.del(id)
		}
	}
	n.cycle()
	n.checkInvariants()
	n.checkMirror()
	watch.mu.Lock()
	defer watch.mu.Unlock()
	for _, v := range watch.violations {
		t.Error(v)
	}
	if watch.unassigned == 0 {
		t.Error("the pool never released surplus: the race was not exercised")
	}
	t.Logf("%d addresses unassigned during the churn", watch.unassigned)
}

// unassignWatch is a vpcsim observer that checks each unassign against the
// datastore.
type unassignWatch struct {
	n          *node
	mu         sync.Mutex
	unassigned int
	violations []string
}

func (w *unassignWatch) AddressesUnassigned(eni string, ps []netip.Prefix) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range ps {
		w.unassigned++
		if h, ok := w.n.d.store.Holder(p.Addr()); ok {
			w.violations = append(w.violations, fmt.Sprintf("cloud unassigned %s from %s while %s holds it", p, eni, h.Key))
		}
	}
}
func (w *unassignWatch) ENIAttached(string, vpcsim.ENIInfo)       {}
func (w *unassignWatch) ENIDetached(string, string)               {}
func (w *unassignWatch) AddressesAssigned(string, []netip.Prefix) {}
func (w *unassignWatch) InstanceTerminated(string)                {}

// TestB37GCReclaimsLeakedSetups: attachments whose teardown never reached
// the daemon are released by GC; live ones never are.
func TestB37GCReclaimsLeakedSetups(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_GC_GRACE": "30s"})
	n.start()
	var live []api.Key
	for i := range 20 {
		id := fmt.Sprintf("s%d", i)
		n.mustAdd(id)
		switch {
		case i%2 == 0:
			n.del(id) // the plugin rolled back its failed ADD
		case i%5 == 1:
			live = append(live, key(id))
		}
	}
	// The SIGKILL variant: the plugin dies right after sending ADD.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(time.Millisecond); cancel() }()
	n.client.Assign(ctx, api.AssignRequest{Key: key("killed"), Pod: api.Pod{Name: "p"}})
	gc := func(valid []api.Key) api.GCResponse {
		r, err := n.client.GC(context.Background(), api.GCRequest{Network: "vpcip", Valid: valid})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := gc(nil); len(r.Released) != 0 {
		t.Fatalf("GC within the grace period released %d", len(r.Released))
	}
	n.clock.Advance(31 * time.Second)
	r := gc(live)
	for _, a := range r.Released {
		for _, k := range live {
			if a.Key == k {
				t.Errorf("GC released live %s", k)
			}
		}
	}
	if st := n.status(); st.Assigned != len(live) {
		t.Errorf("%d assigned after GC, want the %d live", st.Assigned, len(live))
	}
	for _, k := range live {
		if _, ok := n.d.store.Get(k); !ok {
			t.Errorf("live %s lost its address", k)
		}
	}
	gc(nil)
	if st := n.status(); st.Assigned != 0 {
		t.Errorf("%d assigned after GC of an empty live set", st.Assigned)
	}
}

// TestB41SubnetExhaustionDoesNotWedge: ADDs beyond the subnet fail promptly
// naming the subnet; after pods go, addresses are reused, GC and DEL work,
// and a restart in the failed state changes nothing of that.
func TestB41SubnetExhaustionDoesNotWedge(t *testing.T) {
	c := startCloud(t, vpcsim.SubnetSpec{CIDR: netip.MustParsePrefix("100.64.0.0/27"), AvailabilityZone: "us-west-2a"})
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "1", "IP_COOLDOWN_PERIOD": "30", "VPCIP_ADD_WAIT": "200ms"})
	raw := c.raw(t, n.inst.ID)
	hog := createAvailableENI(t, raw, n.inst.SubnetID, nil)
	if _, err := raw.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(hog), SecondaryPrivateIpAddressCount: aws.Int32(13)}); err != nil {
		t.Fatal(err)
	}
	sub, _ := c.Cloud.Subnet(n.inst.SubnetID)
	if sub.FreeAddresses != 12 {
		t.Fatalf("subnet has %d free addresses, want 12", sub.FreeAddresses)
	}
	n.start()
	var ok []string
	for _, id := range names("c", 20) {
		_, err := n.add(id)
		if err == nil {
			ok = append(ok, id)
			continue
		}
		var e *api.Error
		if !errors.As(err, &e) || e.Cause != api.CauseSubnetFull || !strings.Contains(e.Message, n.inst.SubnetID) {
			t.Fatalf("ADD(%s): %v, want no-address naming subnet %s", id, err, n.inst.SubnetID)
		}
	}
	if len(ok) < 9 || len(ok) > 11 {
		t.Errorf("%d ADDs succeeded with 12 free subnet addresses (less one per new ENI)", len(ok))
	}
	if st := n.status(); !strings.Contains(st.Reason, "subnet exhausted") {
		t.Errorf("status reason %q does not say the subnet is exhausted", st.Reason)
	}
	// Restart in the failed state: the refusals are forgotten, so growth is
	// tried again; it may find the last address a larger request could not
	// take, and then fails naming the subnet again.
	n.restart()
	failed := false
	for _, id := range names("extra", 3) {
		_, err := n.add(id)
		if err == nil {
			ok = append(ok, id)
			continue
		}
		var e *api.Error
		if !errors.As(err, &e) || e.Cause != api.CauseSubnetFull {
			t.Fatalf("ADD(%s) after restart: %v, want subnet-full", id, err)
		}
		failed = true
		break
	}
	if !failed {
		t.Fatal("ADDs kept succeeding on an exhausted subnet after restart")
	}
	for _, id := range ok[:len(ok)-1] {
		n.del(id)
	}
	if _, err := n.client.GC(context.Background(), api.GCRequest{Network: "vpcip", Valid: []api.Key{key(ok[len(ok)-1])}}); err != nil {
		t.Errorf("GC on an exhausted subnet: %v", err)
	}
	n.clock.Advance(31 * time.Second)
	for _, id := range names("d", 5) {
		if _, err := n.add(id); err != nil {
			t.Errorf("ADD(%s) after pods left: %v", id, err)
		}
	}
	n.checkInvariants()
	n.checkMirror()
}

// TestShutdownStopsCloudChanges: once shutdown began (SIGTERM, or a node
// being drained), no release or ENI deletion starts (B06 variant).
func TestShutdownStopsCloudChanges(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "2", "IP_COOLDOWN_PERIOD": "0"})
	n.start()
	for _, id := range names("c", 20) {
		n.mustAdd(id)
	}
	for _, id := range names("c", 20) {
		n.del(id)
	}
	n.cycle() // let cycles kicked by the DELs finish
	n.d.life.stopping.Store(true)
	f := c.Cloud.Faults()
	before := f.Calls("UnassignPrivateIpAddresses") + f.Calls("DetachNetworkInterface")
	addrs := len(n.cloudAddrs())
	n.trim(3)
	if f.Calls("UnassignPrivateIpAddresses")+f.Calls("DetachNetworkInterface") != before || len(n.cloudAddrs()) != addrs {
		t.Error("the pool shrank after shutdown began")
	}
	if addrs <= 2 {
		t.Fatalf("only %d addresses left before shutdown: nothing to shrink, the test proves nothing", addrs)
	}
}

// TestHostSetupReappliedOnReconcile: ENIs get their host setup when
// attached, and again on reconciliation after the host lost it.
func TestHostSetupReappliedOnReconcile(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "15"})
	n.host = host
	n.start()
	secondary := n.status().ENIs - 1
	if secondary < 1 || host.enisSetUp() != secondary {
		t.Fatalf("%d secondary ENIs, %d set up on the host", secondary, host.enisSetUp())
	}
	host.flush()
	n.reconcile()
	if host.enisSetUp() != secondary {
		t.Errorf("after reconciliation %d of %d ENIs set up", host.enisSetUp(), secondary)
	}
	for _, e := range n.d.State().ENIs {
		if e.DeviceNumber > 0 && (e.LinkName == "" || e.RouteTable != e.DeviceNumber+1) {
			t.Errorf("ENI %s: link %q table %d", e.ID, e.LinkName, e.RouteTable)
		}
	}
}

// TestVanishedENIIsForgottenAtOnce: an ENI deleted behind the daemon's back
// makes the next growth call fail with not-found; the daemon re-reads EC2 at
// once instead of retrying on a stale view.
func TestVanishedENIIsForgottenAtOnce(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "12"})
	n.start()
	var victim string
	for _, e := range n.d.store.ENIs() {
		if e.DeviceNumber > 0 {
			victim = e.ID
		}
	}
	if victim == "" {
		t.Fatal("no secondary ENI")
	}
	raw := c.raw(t, n.inst.ID)
	ctx := context.Background()
	out, err := raw.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{victim}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: out.NetworkInterfaces[0].Attachment.AttachmentId}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "detach", func() bool { e, _ := c.Cloud.NetworkInterface(victim); return e.Status == "available" })
	if _, err := raw.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(victim)}); err != nil {
		t.Fatal(err)
	}
	// Demand beyond the primary ENI sends growth to the vanished ENI first.
	for _, id := range names("c", 12) {
		if _, err := n.add(id); err != nil {
			t.Fatalf("ADD(%s): %v", id, err)
		}
	}
	for _, e := range n.d.store.ENIs() {
		if e.ID == victim {
			t.Errorf("datastore still has the deleted ENI %s", victim)
		}
	}
	if v := counter(t, n, "vpcip_reconcile_repairs_total", map[string]string{"kind": "forgotten_eni"}); v != 1 {
		t.Errorf("forgotten_eni repairs = %v, want 1", v)
	}
	n.checkInvariants()
}

// TestPrefixModeServesAddressesOutOfPrefixes: with prefix delegation the
// pool holds /28 prefixes, pods get addresses out of them, and a full prefix
// brings the next one.
func TestPrefixModeServesAddressesOutOfPrefixes(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "1", "VPCIP_ADD_WAIT": "10s"})
	n.start()
	st := n.status()
	if st.Warm != 16 || st.Budget != 3*9*16 {
		t.Fatalf("prefix-mode warm-up: %+v, want one /28 warm and a budget of 432", st)
	}
	for _, id := range names("c", 17) {
		a := n.mustAdd(id)
		in := false
		for _, e := range c.Cloud.NetworkInterfaces() {
			for _, p := range e.Prefixes {
				in = in || (e.ID == a.ENIID && e.InstanceID == n.inst.ID && p.Contains(a.Address))
			}
		}
		if !in {
			t.Errorf("%s got %s, in no /28 prefix of %s", id, a.Address, a.ENIID)
		}
	}
	n.cycle()
	if st := n.status(); st.Assigned != 17 || st.Warm < 15 {
		t.Errorf("after 17 pods: %+v, want a second /28 in the pool", st)
	}
	n.checkInvariants()
}

// TestADDNeverWaitsOnCloudWithWarmAddresses: while the pool loop is inside a
// slow EC2 call, ADDs are served from the warm pool without waiting for it
// (no datastore lock is held across a cloud call).
func TestADDNeverWaitsOnCloudWithWarmAddresses(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "5"})
	n.start()
	f := c.Cloud.Faults()
	f.SetLatency("AssignPrivateIpAddresses", 3*time.Second, 0)
	before := f.Calls("AssignPrivateIpAddresses")
	slots := n.d.store.Counts(n.clock.Now()).Slots
	n.mustAdd("c0") // below target: the worker starts a slow refill
	eventually(t, "the refill call", func() bool { return f.Calls("AssignPrivateIpAddresses") > before })
	for _, id := range names("c", 5)[1:] {
		n.mustAdd(id)
	}
	if got := n.d.store.Counts(n.clock.Now()).Slots; got != slots {
		t.Fatalf("slots went from %d to %d: the refill finished before the ADDs, the test proves nothing", slots, got)
	}
	f.SetLatency("AssignPrivateIpAddresses", 0, 0)
}
