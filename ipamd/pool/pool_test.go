package pool

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/provider"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
	"github.com/vpcip/vpcip/warmpool"
)

// virtualClock is a clock the test moves by hand, as a trace simulator does.
type virtualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *virtualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type staticNode struct {
	lim    warmpool.Limits
	subnet string
}

func (n staticNode) Limits() warmpool.Limits { return n.lim }
func (n staticNode) SubnetID() string        { return n.subnet }

type count int

func (c count) Demand() int { return int(c) }

// hostLog records the ENIs the pool hands to the host.
type hostLog struct {
	mu       sync.Mutex
	attached []string
	deleted  []string
}

func (h *hostLog) ENIAttached(e provider.ENI) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attached = append(h.attached, e.ID)
}

func (h *hostLog) ENIDeleted(e datastore.ENI) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deleted = append(h.deleted, e.ID)
}

// rig is one node on vpcsim through the real EC2 provider, with a pool on a
// virtual clock.
type rig struct {
	cloud *vpcsimtest.Local
	clock *virtualClock
	store *datastore.Store
	host  *hostLog
	pool  *Pool
}

func newRig(t *testing.T, o Options) *rig { return newBudgetRig(t, o, nil) }

// newBudgetRig is newRig with the provider's calls drawn from budget (a
// fleet's shared EC2 budget); nil: none.
func newBudgetRig(t *testing.T, o Options, budget provider.RequestBudget) *rig {
	t.Helper()
	cloud := vpcsimtest.Start(t, vpcsim.Config{Seed: 1})
	inst := cloud.Launch(t, "m5.large")
	cfg := sdkConfig(t, cloud, inst.ID)
	prov, err := awsprovider.New(context.Background(), awsprovider.Options{
		ClusterName: "vpcip-pool-test", NodeName: "pool-test",
		MutatingRate: 1000, MutatingBurst: 100, DescribeRate: 1000, DescribeBurst: 100,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, MaxThrottleWait: time.Second,
		MetadataWait: 5 * time.Second, MetadataPoll: 10 * time.Millisecond,
		DetachWait: 5 * time.Second, DetachPoll: 10 * time.Millisecond,
		AWSConfig: &cfg, Budget: budget,
	})
	if err != nil {
		t.Fatalf("provider: %v", err)
	}
	ctx := context.Background()
	self, err := prov.Self(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lim, err := prov.Limits(ctx, self.Type)
	if err != nil {
		t.Fatal(err)
	}
	enis, err := prov.ENIs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{cloud: cloud, clock: &virtualClock{t: time.Now().UTC()}, store: datastore.New(30 * time.Second), host: &hostLog{}}
	r.store.Cloud().Sync(enis, r.clock.Now())
	o.Store, o.Provider, o.Clock, o.Host = r.store, prov, r.clock.Now, r.host
	o.Node = staticNode{lim: warmpool.Limits{MaxENIs: lim.MaxENIs, SlotsPerENI: lim.PodAddressesPerENI()}, subnet: self.SubnetID}
	if r.pool, err = New(o); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) calls(op string) int { return r.cloud.Cloud.Faults().Calls(op) }

// resync is the daemon's resync on the rig: EC2's ENIs applied to the
// datastore (Options.Resync).
func (r *rig) resync(ctx context.Context) error {
	enis, err := r.pool.o.Provider.ENIs(ctx)
	if err != nil {
		return err
	}
	r.store.Cloud().Sync(enis, r.clock.Now())
	return nil
}

// surplus assigns n addresses more on the primary ENI behind the pool's
// back (through the provider) and has the datastore learn them.
func (r *rig) surplus(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.pool.o.Provider.AssignAddresses(ctx, r.store.ENIs()[0].ID, n, false); err != nil {
		t.Fatal(err)
	}
	enis, err := r.pool.o.Provider.ENIs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.store.Cloud().Sync(enis, r.clock.Now())
}

// TestCycleWarmsANewNode: one Cycle brings a new node to WARM_ENI_TARGET=1
// on the virtual clock; the next makes no cloud change and returns the
// interval.
func TestCycleWarmsANewNode(t *testing.T) {
	r := newRig(t, Options{Config: warmpool.Config{WarmENITarget: 1}, Interval: 7 * time.Second})
	ctx := context.Background()
	r.pool.Cycle(ctx)
	now := r.clock.Now()
	sum := warmpool.Summarize(r.pool.Input(now))
	if sum.Short != 0 || sum.Available == 0 {
		t.Fatalf("after one cycle: %+v, want at target with free addresses", sum)
	}
	assigns := r.calls("AssignPrivateIpAddresses")
	if next := r.pool.Cycle(ctx); next != 7*time.Second {
		t.Errorf("Cycle at target returned %v, want the interval 7s", next)
	}
	if got := r.calls("AssignPrivateIpAddresses"); got != assigns {
		t.Errorf("a cycle at target called AssignPrivateIpAddresses %d more times", got-assigns)
	}
}

// TestCycleBacksOffARefusal: a subnet that refuses every size is
// remembered as a refusal with a backoff on the pool's clock; no call is
// made until the virtual clock passes it, and the growth that then succeeds
// clears it.
func TestCycleBacksOffARefusal(t *testing.T) {
	r := newRig(t, Options{Config: warmpool.Config{WarmIPTarget: 3}})
	ctx := context.Background()
	r.cloud.Cloud.Faults().SetErrorRate("AssignPrivateIpAddresses", 1, "InsufficientFreeAddressesInSubnet")
	r.pool.Cycle(ctx)
	refs := r.pool.Refusals(r.clock.Now())
	if len(refs) != 1 || refs[0].Kind != warmpool.RefusedSubnetFull || !refs[0].Until.After(r.clock.Now()) {
		t.Fatalf("refusals after a subnet-full answer: %+v", refs)
	}
	if sum := warmpool.Summarize(r.pool.Input(r.clock.Now())); sum.Available != 0 {
		t.Fatalf("available %d with every request refused", sum.Available)
	}
	tries := r.calls("AssignPrivateIpAddresses")
	r.clock.Advance(100 * time.Millisecond)
	r.pool.Cycle(ctx)
	if got := r.calls("AssignPrivateIpAddresses"); got != tries {
		t.Errorf("a cycle within the backoff called EC2 again (%d → %d)", tries, got)
	}
	r.cloud.Cloud.Faults().Reset()   // the subnet has room again; call counts restart at 0
	r.clock.Advance(3 * time.Minute) // beyond the subnet-full cap of 2 m
	r.pool.Cycle(ctx)
	if got := r.calls("AssignPrivateIpAddresses"); got == 0 {
		t.Errorf("no growth after the backoff ended")
	}
	if refs := r.pool.Refusals(r.clock.Now()); len(refs) != 0 {
		t.Errorf("refusals after successful growth: %+v", refs)
	}
	if sum := warmpool.Summarize(r.pool.Input(r.clock.Now())); sum.Available < 3 {
		t.Errorf("available %d after growth, want ≥ 3", sum.Available)
	}
}

// TestCycleStopsWhenStopping: once shutdown began, Cycle makes no cloud call.
func TestCycleStopsWhenStopping(t *testing.T) {
	r := newRig(t, Options{Config: warmpool.Config{WarmENITarget: 1}, Stopping: func() bool { return true }})
	before := r.calls("AssignPrivateIpAddresses") + r.calls("CreateNetworkInterface")
	r.pool.Cycle(context.Background())
	if after := r.calls("AssignPrivateIpAddresses") + r.calls("CreateNetworkInterface"); after != before {
		t.Errorf("a stopping pool made %d growth calls", after-before)
	}
}

// TestInputReadsDemand: waiting ADDs are warmpool's Pending, the Kubernetes
// part's count its Demand.Unaddressed; both absent read as 0.
func TestInputReadsDemand(t *testing.T) {
	node := staticNode{lim: warmpool.Limits{MaxENIs: 3, SlotsPerENI: 9}}
	p, err := New(Options{Store: datastore.New(0), Provider: nopProvider{}, Node: node, Pending: count(2), Demand: count(5)})
	if err != nil {
		t.Fatal(err)
	}
	in := p.Input(time.Now())
	if in.Pending != 2 || in.Demand.Unaddressed != 5 || in.Limits != node.lim {
		t.Errorf("Input: pending %d, unaddressed %d, limits %+v; want 2, 5, %+v", in.Pending, in.Demand.Unaddressed, in.Limits, node.lim)
	}
	p, _ = New(Options{Store: datastore.New(0), Provider: nopProvider{}, Node: node})
	if in := p.Input(time.Now()); in.Pending != 0 || in.Demand.Unaddressed != 0 {
		t.Errorf("Input without demand sources: pending %d, unaddressed %d", in.Pending, in.Demand.Unaddressed)
	}
	if _, err := New(Options{Provider: nopProvider{}, Node: node}); err == nil {
		t.Error("New without a Store succeeded")
	}
}

// liveCount is a LiveDemand: a count and whether it is live.
type liveCount struct {
	n    int
	live bool
}

func (c liveCount) Demand() int { return c.n }
func (c liveCount) Live() bool  { return c.live }

// TestInputReadsBindings: Demand.Bindings is the Kubernetes part's Live, and
// false for a demand source that cannot tell or is not live.
func TestInputReadsBindings(t *testing.T) {
	node := staticNode{lim: warmpool.Limits{MaxENIs: 3, SlotsPerENI: 9}}
	for _, c := range []struct {
		demand Demand
		want   bool
	}{{liveCount{3, true}, true}, {liveCount{0, false}, false}, {count(3), false}, {nil, false}} {
		p, err := New(Options{Store: datastore.New(0), Provider: nopProvider{}, Node: node, Demand: c.demand})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Input(time.Now()).Demand.Bindings; got != c.want {
			t.Errorf("demand %#v: Bindings %v, want %v", c.demand, got, c.want)
		}
	}
}

// nopProvider is never called: Input reads no cloud.
type nopProvider struct{ provider.Provider }

// sdkConfig is the AWS SDK's configuration of the instance instanceID on
// cloud: vpcsim's EC2 and IMDS endpoints, static credentials, no shared files.
func sdkConfig(t *testing.T, cloud *vpcsimtest.Local, instanceID string) aws.Config {
	t.Helper()
	cfg, err := awsconfig.LoadDefaultConfig(context.Background(),
		awsconfig.WithRegion("us-west-2"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDPOOLTEST", "secret", "")),
		awsconfig.WithBaseEndpoint(cloud.EC2URL),
		awsconfig.WithEC2IMDSEndpoint(cloud.IMDSURL(instanceID)),
		awsconfig.WithSharedConfigFiles([]string{}),
		awsconfig.WithSharedCredentialsFiles([]string{}),
	)
	if err != nil {
		t.Fatalf("SDK config: %v", err)
	}
	return cfg
}

// TestENILimitRefusalLearnsTheENIsEC2Holds: when EC2 refuses an ENI at the
// instance's attachment limit while the datastore holds fewer (ENIs
// attached by calls whose end the daemon lost), one cycle learns them from
// EC2, so the next plan uses them instead of making and deleting more.
func TestENILimitRefusalLearnsTheENIsEC2Holds(t *testing.T) {
	r := newRig(t, Options{Config: warmpool.Config{WarmIPTarget: 25}})
	ctx := context.Background()
	r.pool.o.Resync = r.resync
	// Two ENIs attached behind the pool's back fill the m5.large's three.
	for range 2 {
		if _, err := r.pool.o.Provider.CreateENI(ctx, provider.CreateENIRequest{Addresses: 9}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.store.ENIs()); n != 1 {
		t.Fatalf("datastore holds %d ENIs before the cycle, want the primary alone", n)
	}
	creates := r.calls("CreateNetworkInterface")
	for range 3 {
		r.pool.Cycle(ctx)
		r.clock.Advance(time.Minute)
	}
	if n := len(r.store.ENIs()); n != 3 {
		t.Errorf("datastore holds %d ENIs after the refusal, want the 3 EC2 holds", n)
	}
	if extra := r.calls("CreateNetworkInterface") - creates; extra > 1 {
		t.Errorf("%d ENIs created after EC2 refused the first at its limit, want at most that one", extra)
	}
}

// TestCycleBacksOffAThrottledRelease: EC2 throttles the release of a
// surplus (RequestLimitExceeded on UnassignPrivateIpAddresses): the cycle
// stops after the first refused release and waits out its backoff, rather
// than asking again at once up to its step limit, which adds to the
// throttling of the account's bucket; a cycle within the backoff makes no
// call, and the release goes once the throttling ends.
func TestCycleBacksOffAThrottledRelease(t *testing.T) {
	r := newRig(t, Options{Config: warmpool.Config{WarmIPTarget: 2}})
	ctx := context.Background()
	r.pool.Cycle(ctx)
	// 6 addresses more on the primary ENI, assigned behind the pool's back:
	// a surplus under WARM_IP_TARGET=2.
	r.surplus(t, 6)
	r.clock.Advance(2 * time.Minute) // beyond the release interval after the growth
	r.cloud.Cloud.Faults().SetErrorRate("UnassignPrivateIpAddresses", 1, "RequestLimitExceeded")
	next := r.pool.Cycle(ctx)
	first := r.calls("UnassignPrivateIpAddresses")
	if first == 0 {
		t.Fatalf("setup: no release asked for (%+v)", warmpool.Summarize(r.pool.Input(r.clock.Now())))
	}
	if next < 500*time.Millisecond {
		t.Errorf("Cycle returned %v after a throttled release; want its backoff, at least 0.5 s (the first throttling backoff, 1 s jittered over [d/2, d])", next)
	}
	// One refused release: the provider's own retries within
	// MaxThrottleWait (1 s in the rig), not another round per cycle step.
	perRelease := first
	r.clock.Advance(100 * time.Millisecond)
	r.pool.Cycle(ctx)
	if got := r.calls("UnassignPrivateIpAddresses"); got != first {
		t.Errorf("a cycle within the backoff called UnassignPrivateIpAddresses again (%d → %d)", first, got)
	}
	t.Logf("%d UnassignPrivateIpAddresses requests for one throttled release", perRelease)
	r.cloud.Cloud.Faults().Reset()
	r.clock.Advance(3 * time.Minute)
	r.pool.Cycle(ctx)
	if sum := warmpool.Summarize(r.pool.Input(r.clock.Now())); sum.Available > 2+1 {
		t.Errorf("after the throttling ended: %+v; want the surplus released", sum)
	}
}

// lostAnswer is the provider with UnassignPrivateIpAddresses's answer lost:
// EC2 (vpcsim, through the SDK) applies the release, and the call returns
// the error the provider's retry then gets (the addresses are not assigned
// any more).
type lostAnswer struct {
	provider.Provider
}

func (l lostAnswer) UnassignAddresses(ctx context.Context, eniID string, addrs []netip.Prefix) error {
	if err := l.Provider.UnassignAddresses(ctx, eniID, addrs); err != nil {
		return err
	}
	return errors.New("api error InvalidParameterValue: Some of the specified addresses are not assigned to interface " + eniID)
}

// TestLostReleaseAnswerHandsOutNothingEC2TookBack: a release EC2 applied
// but whose answer was lost leaves no address assignable that EC2 no longer
// gives the node (handed to a pod, it could be another instance's by then):
// with the resync, the datastore holds exactly what EC2 shows; without one,
// the slots are forgotten. Before, they were free again at once.
func TestLostReleaseAnswerHandsOutNothingEC2TookBack(t *testing.T) {
	for _, withResync := range []bool{true, false} {
		t.Run(map[bool]string{true: "resync", false: "no resync"}[withResync], func(t *testing.T) {
			r := newRig(t, Options{Config: warmpool.Config{WarmIPTarget: 2}})
			ctx := context.Background()
			r.pool.o.Provider = lostAnswer{r.pool.o.Provider}
			if withResync {
				r.pool.o.Resync = r.resync
			}
			r.pool.Cycle(ctx)
			r.surplus(t, 6)
			before := r.calls("UnassignPrivateIpAddresses")
			r.clock.Advance(2 * time.Minute)
			r.pool.Cycle(ctx)
			if r.calls("UnassignPrivateIpAddresses") == before {
				t.Fatalf("setup: no release asked for (%+v)", warmpool.Summarize(r.pool.Input(r.clock.Now())))
			}
			ec2 := map[netip.Addr]string{}
			for _, e := range r.cloud.Cloud.NetworkInterfaces() {
				for _, a := range e.SecondaryIPs {
					ec2[a] = e.ID
				}
			}
			for _, e := range r.store.ENIs() {
				for _, s := range e.Slots {
					if ec2[s.Addr()] != e.ID {
						t.Errorf("the datastore has %v on %s, which EC2 took back (lost answer)", s, e.ID)
					}
				}
			}
			// What an ADD gets now is the node's in EC2.
			for i := range 12 {
				k := api.Key{Network: "vpcip", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}
				a, _, err := r.store.AssignIn(k, api.Pod{}, "", r.clock.Now())
				if err != nil {
					break
				}
				if ec2[a.Address] != a.ENIID {
					t.Errorf("ADD got %v on %s, which EC2 does not give this node", a.Address, a.ENIID)
				}
			}
		})
	}
}

// TestCycleBacksOffAnUnclassifiedFailure: a growth EC2 fails with an error
// that is no refusal warmpool plans around (UnauthorizedOperation: a role
// without the permission; InternalError) waits out its backoff however
// often cycles run (a waiting ADD kicks one every 100 ms), names the error
// for ADDs and status (LastFailure), and goes once the backoff ends.
// Before, every cycle sent the same call again: about 10 requests a second
// per node for as long as pods waited.
func TestCycleBacksOffAnUnclassifiedFailure(t *testing.T) {
	for _, code := range []string{"UnauthorizedOperation", "InternalError"} {
		t.Run(code, func(t *testing.T) {
			r := newRig(t, Options{Config: warmpool.Config{WarmIPTarget: 3}, Pending: count(2)})
			ctx := context.Background()
			r.cloud.Cloud.Faults().SetErrorRate("AssignPrivateIpAddresses", 1, code)
			for i := range 50 { // 5 s of kicks
				if i > 0 {
					r.clock.Advance(100 * time.Millisecond)
				}
				r.pool.Cycle(ctx) // the last failure's backoff is in force after any cycle
			}
			got := r.calls("AssignPrivateIpAddresses")
			t.Logf("%d AssignPrivateIpAddresses requests in 5 s of cycles every 100 ms", got)
			// Backoffs of at least 0.5, 1 and 2 s (1 s doubling, jittered
			// over [d/2, d]) fit at most 4 failed growths in 5 s, each
			// with the provider's own retries of a 5xx (at most 4 tries).
			if got == 0 || got > 4*4 {
				t.Errorf("%d AssignPrivateIpAddresses requests in 5 s of cycles every 100 ms; want at most 16 (4 growths within their backoff)", got)
			}
			f, ok := r.pool.LastFailure(r.clock.Now())
			if !ok || f.Action != "assign" || !strings.Contains(f.Err.Error(), code) {
				t.Errorf("LastFailure = %+v, %v; want the assign's %s", f, ok, code)
			}
			r.cloud.Cloud.Faults().Reset()
			r.clock.Advance(3 * time.Minute) // beyond the 2-minute cap
			r.pool.Cycle(ctx)
			if sum := warmpool.Summarize(r.pool.Input(r.clock.Now())); sum.Available < 3 {
				t.Errorf("available %d once the failure ended, want ≥ 3", sum.Available)
			}
			if _, ok := r.pool.LastFailure(r.clock.Now()); ok {
				t.Error("LastFailure still reported after a growth succeeded")
			}
		})
	}
}

// demandCount is a Demand the test changes.
type demandCount struct{ n atomic.Int64 }

func (d *demandCount) Demand() int { return int(d.n.Load()) }

// TestReleaseFailuresDoNotLengthenAGrowthHold: releases that keep failing
// (a role without UnassignPrivateIpAddresses) count their strikes apart
// from growth's: one transient growth failure afterwards is held its first
// backoff (at most 1 s), not the cap of 2 minutes, while pods wait (found by
// review).
func TestReleaseFailuresDoNotLengthenAGrowthHold(t *testing.T) {
	d := &demandCount{}
	r := newRig(t, Options{Config: warmpool.Config{WarmIPTarget: 2}, Pending: d})
	ctx := context.Background()
	r.pool.Cycle(ctx)
	r.surplus(t, 6)
	r.cloud.Cloud.Faults().SetErrorRate("UnassignPrivateIpAddresses", 1, "UnauthorizedOperation")
	for range 8 {
		r.clock.Advance(3 * time.Minute)
		r.pool.Cycle(ctx)
	}
	for i := range 20 { // pods take every free address
		k := api.Key{Network: "vpcip", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}
		if _, _, err := r.store.AssignIn(k, api.Pod{}, "", r.clock.Now()); err != nil {
			break
		}
	}
	d.n.Store(3)
	r.cloud.Cloud.Faults().SetErrorRate("AssignPrivateIpAddresses", 1, "InternalError")
	r.pool.Cycle(ctx)
	r.cloud.Cloud.Faults().SetErrorRate("AssignPrivateIpAddresses", 0, "")
	for range 15 {
		r.clock.Advance(100 * time.Millisecond)
		r.pool.Cycle(ctx)
		if sum := warmpool.Summarize(r.pool.Input(r.clock.Now())); sum.Available > 0 {
			return
		}
	}
	f, _ := r.pool.LastFailure(r.clock.Now())
	t.Errorf("no growth 1.5 s after one transient growth failure: held %v more", f.Until.Sub(r.clock.Now()))
}
