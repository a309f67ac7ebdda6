package ipamd

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/provider"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/warmpool"
)

// TestB05StaleMetadataNeverFreesAssigned: instance metadata that lists the
// same number of addresses with one swapped, or omits an ENI, triggers an EC2
// Describe, and never an unassign, detach or reuse.
func TestB05StaleMetadataNeverFreesAssigned(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "3"})
	staged := &stagedMetadata{}
	n.wrap = func(p provider.Provider) provider.Provider { staged.Provider = p; return staged }
	n.start()
	n.mustAdd("c1")
	a2 := n.mustAdd("c2")
	n.cycle()
	f := c.Cloud.Faults()
	describe := f.Calls("DescribeNetworkInterfaces")
	watch := &unassignWatch{n: n}
	c.Cloud.SetObserver(watch)
	defer c.Cloud.SetObserver(nil)
	phantom := netip.MustParseAddr("100.64.15.200") // in the subnet, on no ENI
	staged.set(func(enis []provider.ENI) []provider.ENI {
		for i, e := range enis {
			if e.ID == a2.ENIID {
				e.SecondaryIPs = slices.Clone(e.SecondaryIPs)
				for j, a := range e.SecondaryIPs {
					if a == a2.Address {
						e.SecondaryIPs[j] = phantom
					}
				}
				slices.SortFunc(e.SecondaryIPs, netip.Addr.Compare)
				enis[i] = e
			}
		}
		return enis
	})
	for range 3 {
		n.reconcile()
	}
	if got := f.Calls("DescribeNetworkInterfaces"); got <= describe {
		t.Error("metadata disagreed and no EC2 Describe confirmed it")
	}
	if got, ok := n.d.store.Get(key("c2")); !ok || got.Address != a2.Address || got.ENIID != a2.ENIID {
		t.Fatalf("c2 after stale metadata: %+v %v, want %s on %s", got, ok, a2.Address, a2.ENIID)
	}
	if _, ok := n.cloudAddrs()[a2.Address]; !ok {
		t.Fatal("c2's address was unassigned in the cloud")
	}
	for _, id := range names("n", 5) {
		if a := n.mustAdd(id); a.Address == phantom {
			t.Fatalf("%s got the address only stale metadata shows", id)
		}
	}

	// Variant: metadata omits the ENI for two ticks, then shows it again.
	staged.set(func(enis []provider.ENI) []provider.ENI {
		return slices.DeleteFunc(enis, func(e provider.ENI) bool { return e.ID == a2.ENIID })
	})
	n.reconcile()
	n.reconcile()
	staged.set(nil)
	n.reconcile()
	watch.mu.Lock()
	for _, v := range watch.violations {
		t.Error(v)
	}
	watch.mu.Unlock()
	if f.Calls("DetachNetworkInterface") != 0 || f.Calls("DeleteNetworkInterface") != 0 {
		t.Error("an ENI was detached or deleted on stale metadata")
	}
	if got, ok := n.d.store.Get(key("c2")); !ok || got.Address != a2.Address {
		t.Errorf("c2 lost its address: %+v", got)
	}
	n.checkInvariants()
}

// TestB08IdleNodeMakesNoEC2Calls: in steady state, reconciliation reads only
// instance metadata; EC2 is called only when metadata disagrees (and by the
// jittered resync and leak sweep, minutes apart).
func TestB08IdleNodeMakesNoEC2Calls(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	n.mustAdd("c1")
	n.cycle()
	before := c.Cloud.Faults().CallCounts()
	for range 10 {
		n.reconcile()
	}
	after := c.Cloud.Faults().CallCounts()
	for op, v := range after {
		if op != "imds" && v != before[op] {
			t.Errorf("idle node called %s %d times", op, v-before[op])
		}
	}
	if after["imds"] <= before["imds"] {
		t.Error("reconciliation did not read instance metadata")
	}
}

// TestB08FleetStartUnderThrottling: fifty daemons start at once against an
// account-wide token bucket (20 calls/s, burst 50, as docs/field-failures.md
// B08); every one ends with a usable pool after one batched Describe.
func TestB08FleetStartUnderThrottling(t *testing.T) {
	c := startCloud(t)
	f := c.Cloud.Faults()
	f.SetThrottle(false, 20, 50)
	f.SetThrottle(true, 20, 50)
	nodes := make([]*node, 50)
	for i := range nodes {
		nodes[i] = newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "3", "VPCIP_ADD_WAIT": "10s"})
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		n.startNoWait()
		wg.Go(func() {
			select {
			case <-n.d.Ready():
			case <-time.After(60 * time.Second):
			}
		})
	}
	wg.Wait()
	for i, n := range nodes {
		if !n.d.life.readyOK.Load() {
			t.Fatalf("node %d not ready: %s", i, n.d.Status().Reason)
		}
	}
	for i, n := range nodes {
		a := n.mustAdd("c1")
		if _, ok := n.cloudAddrs()[a.Address]; !ok {
			t.Errorf("node %d: assigned %s is not on its ENIs", i, a.Address)
		}
	}
	// One batched Describe per node at start; throttled attempts are
	// retried with jittered backoff, a bounded number of times.
	throttled := 0.0
	for i, n := range nodes {
		if got := counter(t, n, "vpcip_provider_calls_total", map[string]string{"operation": "DescribeNetworkInterfaces", "outcome": "ok"}); got != 1 {
			t.Errorf("node %d made %v DescribeNetworkInterfaces at start, want 1", i, got)
		}
		throttled += counter(t, n, "vpcip_provider_calls_total", map[string]string{"operation": "DescribeNetworkInterfaces", "outcome": "throttled"})
	}
	t.Logf("%d EC2 DescribeNetworkInterfaces in all, %v throttled", f.Calls("DescribeNetworkInterfaces"), throttled)
}

// TestB06LeakedENIsSwept: an ENI left available by a node that died between
// detach and delete is deleted by another node's sweep; untagged ENIs and
// other clusters' ENIs are left alone.
func TestB06LeakedENIsSwept(t *testing.T) {
	c := startCloud(t)
	n1 := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "12"})
	n1.start()
	var leaked string
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID == n1.inst.ID && e.DeviceIndex > 0 {
			leaked = e.ID
			for _, tag := range []string{awsprovider.TagInstanceID, awsprovider.TagCluster, awsprovider.TagCreatedAt} {
				if e.Tags[tag] == "" {
					t.Errorf("created ENI %s lacks tag %s: %v", e.ID, tag, e.Tags)
				}
			}
		}
	}
	if leaked == "" {
		t.Fatal("node 1 created no secondary ENI")
	}
	n1.shutdown()
	raw := c.raw(t, n1.inst.ID)
	ctx := context.Background()
	out, err := raw.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{leaked}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{
		AttachmentId: out.NetworkInterfaces[0].Attachment.AttachmentId}); err != nil {
		t.Fatal(err)
	}
	if err := c.Cloud.TerminateInstance(n1.inst.ID); err != nil {
		t.Fatal(err)
	}
	untagged := createAvailableENI(t, raw, n1.inst.SubnetID, nil)
	other := createAvailableENI(t, raw, n1.inst.SubnetID, map[string]string{awsprovider.TagCluster: "other-cluster",
		awsprovider.TagCreatedAt: "2020-01-01T00:00:00Z"})

	n2 := newNode(t, c, itypeSmall, map[string]string{"VPCIP_LEAKED_ENI_GRACE": "0s"})
	n2.start()
	n2.cycle(func(ctx context.Context) { n2.d.rec.sweepLeaked(ctx) })
	if _, ok := c.Cloud.NetworkInterface(leaked); ok {
		t.Errorf("leaked ENI %s not deleted", leaked)
	}
	for _, id := range []string{untagged, other} {
		if _, ok := c.Cloud.NetworkInterface(id); !ok {
			t.Errorf("sweep deleted %s, which is not this cluster's", id)
		}
	}
	if v := counter(t, n2, "vpcip_reconcile_repairs_total", map[string]string{"kind": "leaked_eni_deleted"}); v != 1 {
		t.Errorf("leaked_eni_deleted repairs = %v, want 1", v)
	}
}

func createAvailableENI(t *testing.T, raw *ec2.Client, subnet string, tags map[string]string) string {
	t.Helper()
	in := &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnet)}
	if len(tags) > 0 {
		spec := types.TagSpecification{ResourceType: types.ResourceTypeNetworkInterface}
		for _, k := range slices.Sorted(maps.Keys(tags)) {
			spec.Tags = append(spec.Tags, types.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
		}
		in.TagSpecifications = []types.TagSpecification{spec}
	}
	out, err := raw.CreateNetworkInterface(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return *out.NetworkInterface.NetworkInterfaceId
}

var _ = api.Version
var _ = warmpool.Nothing

// TestB05StaleIMDSThroughProvider: the same as above with vpcsim's own IMDS
// serving the stale view, through the provider's metadata path: a swapped
// address and a hidden ENI never lead to an unassign, detach or reuse.
func TestB05StaleIMDSThroughProvider(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "3"})
	n.host = host
	n.start()
	var onB []api.Assignment
	for _, id := range names("c", 11) { // the primary ENI holds 9: two land on eni-B
		a := n.mustAdd(id)
		if a.DeviceNumber == 1 {
			onB = append(onB, a)
		}
	}
	if len(onB) != 2 {
		t.Fatalf("%d pods on the secondary ENI, want 2", len(onB))
	}
	n.cycle()
	eniB, _ := c.Cloud.NetworkInterface(onB[1].ENIID)
	f := c.Cloud.Faults()
	phantom := netip.MustParseAddr("100.64.15.201")
	ips := []string{eniB.PrimaryIP.String()}
	for _, a := range eniB.SecondaryIPs {
		if a == onB[1].Address {
			a = phantom
		}
		ips = append(ips, a.String())
	}
	watch := &unassignWatch{n: n}
	c.Cloud.SetObserver(watch)
	defer c.Cloud.SetObserver(nil)
	macPath := "meta-data/network/interfaces/macs/" + eniB.MAC
	f.SetIMDSOverride(n.inst.ID, macPath+"/local-ipv4s", strings.Join(ips, "\n"))
	for range 3 {
		n.reconcile()
	}
	f.ClearIMDSOverrides(n.inst.ID)
	f.HideIMDS(n.inst.ID, macPath)
	n.reconcile()
	n.reconcile()
	f.ClearIMDSOverrides(n.inst.ID)
	n.reconcile()
	watch.mu.Lock()
	for _, v := range watch.violations {
		t.Error(v)
	}
	watch.mu.Unlock()
	if e, ok := c.Cloud.NetworkInterface(eniB.ID); !ok || e.InstanceID != n.inst.ID || f.Calls("DetachNetworkInterface") != 0 {
		t.Errorf("eni-B detached or gone during stale metadata: %+v", e)
	}
	for _, a := range onB {
		if got, ok := n.d.store.Get(a.Key); !ok || got.Address != a.Address || got.ENIID != a.ENIID {
			t.Errorf("%s after stale metadata: %+v, want %s on %s", a.Key, got, a.Address, a.ENIID)
		}
	}
	if _, ok := n.d.store.Holder(phantom); ok {
		t.Error("the phantom address is held")
	}
	if host.enisSetUp() != 1 {
		t.Errorf("%d secondary ENIs set up on the host, want 1", host.enisSetUp())
	}
	n.checkInvariants()
}

// TestLaggingDescribeKeepsNewENI: an EC2 Describe that lags behind a just
// attached ENI does not make the daemon forget the ENI or tear down its host
// setup under its pods; a second read that still lacks it does.
func TestLaggingDescribeKeepsNewENI(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "1", "VPCIP_ADD_WAIT": "10s"})
	n.host = host
	n.start()
	c.Cloud.Faults().SetDescribeLag(time.Hour) // every Describe answers the state before now
	var onB api.Assignment
	for _, id := range names("c", 10) {
		if a := n.mustAdd(id); a.DeviceNumber == 1 {
			onB = a
		}
	}
	if onB.ENIID == "" {
		t.Fatal("no pod on a secondary ENI")
	}
	lagging, err := n.prov.ENIs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range lagging {
		if e.ID == onB.ENIID {
			t.Fatal("EC2 Describe shows the new ENI: the lag is not exercised")
		}
	}
	resync := func(ctx context.Context) { n.d.rec.reconcile(ctx, true) }
	n.cycle(resync)
	if got, ok := n.d.store.Get(onB.Key); !ok || got.ENIID != onB.ENIID || host.enisSetUp() != 1 {
		t.Fatalf("after one lagging Describe: %+v, %d ENIs set up; want %s kept", got, host.enisSetUp(), onB.ENIID)
	}
	c.Cloud.Faults().SetDescribeLag(0)
	n.cycle(resync)
	n.cycle(resync)
	if got, ok := n.d.store.Get(onB.Key); !ok || got.ENIID != onB.ENIID {
		t.Errorf("after Describe caught up: %+v", got)
	}
	n.checkInvariants()
}

// TestB08IdleLoopWithRealTimers: the worker's own timers (reconciliation
// every 50 ms here) on an idle node read instance metadata and call no EC2
// action.
func TestB08IdleLoopWithRealTimers(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_RECONCILE_INTERVAL": "50ms", "VPCIP_POOL_INTERVAL": "50ms"})
	n.start()
	n.mustAdd("c1")
	n.cycle()
	before := c.Cloud.Faults().CallCounts()
	time.Sleep(time.Second) // about 20 reconciliations and pool cycles
	after := c.Cloud.Faults().CallCounts()
	for op, v := range after {
		if op != "imds" && v != before[op] {
			t.Errorf("idle node called %s %d times in a second", op, v-before[op])
		}
	}
	if after["imds"]-before["imds"] < 5 {
		t.Errorf("only %d metadata reads: the reconciliation timer did not run", after["imds"]-before["imds"])
	}
}
