package pool

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
	"github.com/vpcip/vpcip/warmpool"
)

// fragHours is the simulated length of TestFragmentationScenario (make
// bench-frag); the default is the short variant of every go test run.
var (
	fragHours   = flag.Float64("frag.hours", 1.5, "simulated hours of TestFragmentationScenario")
	fragScatter = flag.Bool("frag.scatter", true, "TestFragmentationScenario: EC2 picks addresses at random (vpcsim ScatterAddresses); false: lowest first")
)

// simNode is one vpcipd pool (datastore, pool, the real EC2 provider) on an
// instance of a shared vpcsim cloud, on a shared virtual clock.
type simNode struct {
	id     string
	prefix bool
	store  *datastore.Store
	pool   *Pool
	pods   []string
	next   int
	due    time.Time // when the pool's next cycle is due
}

// launchNode launches an instance of typ in subnet and builds its pool.
func launchNode(t *testing.T, cloud *vpcsimtest.Local, clock *virtualClock, typ, subnet string, o Options) *simNode {
	t.Helper()
	inst, err := cloud.Cloud.LaunchInstance(typ, subnet)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sdkConfig(t, cloud, inst.ID)
	prov, err := awsprovider.New(context.Background(), awsprovider.Options{
		ClusterName: "vpcip-frag-test", NodeName: inst.ID,
		MutatingRate: 1000, MutatingBurst: 100, DescribeRate: 1000, DescribeBurst: 100,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, MaxThrottleWait: time.Second,
		MetadataWait: 5 * time.Second, MetadataPoll: 10 * time.Millisecond,
		DetachWait: 5 * time.Second, DetachPoll: 10 * time.Millisecond,
		AWSConfig: &cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim, err := prov.Limits(ctx, typ)
	if err != nil {
		t.Fatal(err)
	}
	enis, err := prov.ENIs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := &simNode{id: inst.ID, prefix: o.Config.PrefixDelegation, store: datastore.New(30 * time.Second)}
	n.store.Cloud().Sync(enis, clock.Now())
	o.Store, o.Provider, o.Clock = n.store, prov, clock.Now
	o.Node = staticNode{lim: warmpool.Limits{MaxENIs: lim.MaxENIs, SlotsPerENI: lim.PodAddressesPerENI(), PrefixSupported: lim.PrefixDelegation}, subnet: subnet}
	if n.pool, err = New(o); err != nil {
		t.Fatal(err)
	}
	return n
}

func podKey(pod string) api.Key { return api.Key{Network: "vpcip", ContainerID: pod, IfName: "eth0"} }

// start adds one pod; false when the node has no free address.
func (n *simNode) start(now time.Time) bool {
	pod := fmt.Sprintf("%s-%d", n.id, n.next)
	if _, _, err := n.store.Assign(podKey(pod), api.Pod{Namespace: "default", Name: pod}, now); err != nil {
		return false
	}
	n.next++
	n.pods = append(n.pods, pod)
	return true
}

// stop removes the pod at index i.
func (n *simNode) stop(i int, now time.Time) {
	n.store.Release(podKey(n.pods[i]), now)
	n.pods = slices.Delete(n.pods, i, i+1)
}

// singles and prefixes count what the node holds.
func (n *simNode) holdings() (singles, prefixes int) {
	for _, e := range n.store.ENIs() {
		for _, sl := range e.Slots {
			if sl.Bits() == 32 {
				singles++
			} else {
				prefixes++
			}
		}
	}
	return singles, prefixes
}

// fragResult is one run of the scenario.
type fragResult struct {
	wholeAt       []int // whole free /28s at each report
	minWhole      int
	meanWhole     float64
	fallbackMean  float64 // single addresses the churning prefix nodes held (fallback), mean over the run
	probePrefixes int     // /28s the probe prefix node got
	probeSingles  int     // single addresses it fell back to
	noPrefix      int     // InsufficientCidrBlocks answers to the churning prefix nodes
	assigns       int     // AssignPrivateIpAddresses calls
	describes     int     // DescribeNetworkInterfaces calls
	namedRefused  int     // named assignments EC2 refused (stale view), each followed by one letting EC2 choose
}

// runFragScenario churns one /22 subnet (62 aligned /28s free of reserved
// addresses) shared by eight secondary-IP nodes (m5.xlarge, WARM_IP_TARGET=3)
// and two prefix-mode nodes (m5.xlarge, WARM_PREFIX_TARGET=1) for the given
// simulated time, on the virtual clock: every 20 s each node's pod count
// moves by a seeded random step toward a target that changes every 10
// minutes, and each node's pool cycles when its delay is due. Every
// reportEvery it records the subnet's whole free /28s; at the end a new
// prefix-mode node asks for 3 /28s (a node filling up) and the result says
// how many it got and how many single addresses it fell back to.
func runFragScenario(t *testing.T, d time.Duration, aware, scatter bool, reportEvery time.Duration) fragResult {
	const subnet = "subnet-0000000000000f28"
	cloud := vpcsimtest.Start(t, vpcsim.Config{Seed: 28, ScatterAddresses: scatter, Subnets: []vpcsim.SubnetSpec{
		{ID: subnet, CIDR: netip.MustParsePrefix("100.64.0.0/22"), AvailabilityZone: "us-west-2a"},
	}})
	clock := &virtualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	opts := func(cfg warmpool.Config) Options {
		return Options{Config: cfg, AddressOrder: !aware, Interval: 10 * time.Second}
	}
	var nodes []*simNode
	for i := range 10 {
		cfg := warmpool.Config{WarmIPTarget: 3, ReleaseInterval: 30 * time.Second, ENIMinAge: time.Minute}
		if i%5 == 4 {
			cfg = warmpool.Config{PrefixDelegation: true, WarmPrefixTarget: 1, ReleaseInterval: 30 * time.Second, ENIMinAge: time.Minute}
		}
		nodes = append(nodes, launchNode(t, cloud, clock, "m5.xlarge", subnet, opts(cfg)))
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(28, 28))
	targets := make([]int, len(nodes))
	whole := func() int {
		s, _ := cloud.Cloud.Subnet(subnet)
		return s.FreePrefixes
	}
	var res fragResult
	res.minWhole = 1 << 30
	const step = 20 * time.Second
	end := clock.Now().Add(d)
	nextReport := clock.Now()
	samples, sum, fallback := 0, 0, 0
	for now := clock.Now(); now.Before(end); now = clock.Now() {
		if now.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))%(10*time.Minute) == 0 {
			for i := range targets {
				targets[i] = 4 + rng.IntN(36) // 4..39 pods
			}
		}
		for i, n := range nodes {
			diff := targets[i] - len(n.pods)
			moves := rng.IntN(4)
			for range moves {
				switch {
				case diff > 0 && n.start(now):
					diff--
				case diff < 0 || (diff == 0 && len(n.pods) > 0 && rng.IntN(3) == 0):
					// churn: a pod goes (and, at target, another comes)
					if len(n.pods) > 0 {
						n.stop(rng.IntN(len(n.pods)), now)
						if diff == 0 {
							n.start(now)
						} else {
							diff++
						}
					}
				}
			}
			if !n.due.After(now) {
				wait := n.pool.Cycle(ctx)
				n.due = clock.Now().Add(wait)
				for _, r := range n.pool.Refusals(clock.Now()) {
					if r.Kind == warmpool.RefusedNoPrefix && n.prefix {
						res.noPrefix++
					}
				}
			}
		}
		w := whole()
		samples++
		sum += w
		for _, n := range nodes {
			if n.prefix {
				singles, _ := n.holdings()
				fallback += singles
			}
		}
		res.minWhole = min(res.minWhole, w)
		if !now.Before(nextReport) {
			res.wholeAt = append(res.wholeAt, w)
			nextReport = nextReport.Add(reportEvery)
		}
		clock.t = now.Add(step)
	}
	res.meanWhole = float64(sum) / float64(samples)
	res.fallbackMean = float64(fallback) / float64(samples)
	probe := launchNode(t, cloud, clock, "m5.xlarge", subnet, opts(warmpool.Config{PrefixDelegation: true, WarmPrefixTarget: 3}))
	for range 5 {
		probe.pool.Cycle(ctx)
		clock.Advance(time.Second)
	}
	res.probeSingles, res.probePrefixes = probe.holdings()
	for _, n := range nodes {
		res.namedRefused += n.pool.namedRefused
	}
	res.assigns = cloud.Cloud.Faults().Calls("AssignPrivateIpAddresses")
	res.describes = cloud.Cloud.Faults().Calls("DescribeNetworkInterfaces")
	return res
}

// TestFragmentationScenario runs the churn of runFragScenario without and
// with the /28-aware choice of single addresses and asserts that the
// subnet keeps more whole /28s with it, and the prefix-mode nodes fall back
// to fewer single addresses. The short variant runs 90 simulated minutes
// (the pools read no subnet view in their first 5–15 minutes); `make
// bench-frag` runs hours (-frag.hours) and prints the whole /28s every 15
// simulated minutes.
func TestFragmentationScenario(t *testing.T) {
	d := time.Duration(*fragHours * float64(time.Hour))
	every := 15 * time.Minute
	without := runFragScenario(t, d, false, *fragScatter, every)
	with := runFragScenario(t, d, true, *fragScatter, every)
	t.Logf("one /22 subnet (62 /28s free of reserved addresses), 8 secondary-IP + 2 prefix-mode m5.xlarge nodes churning, %v simulated, EC2 choosing addresses %s",
		d, map[bool]string{true: "at random", false: "lowest first"}[*fragScatter])
	t.Logf("whole free /28s every %v:", every)
	t.Logf("  without: %v", without.wholeAt)
	t.Logf("  with:    %v", with.wholeAt)
	for _, r := range []struct {
		name string
		fragResult
	}{{"without", without}, {"with", with}} {
		t.Logf("%-7s: whole /28s mean %.1f, min %d; churning prefix nodes refused a /28 (InsufficientCidrBlocks) in %d cycles and held %.1f single addresses on average (fallback); probe prefix node got %d /28s and %d single addresses; AssignPrivateIpAddresses %d (%d named ones refused), DescribeNetworkInterfaces %d",
			r.name, r.meanWhole, r.minWhole, r.noPrefix, r.fallbackMean, r.probePrefixes, r.probeSingles, r.assigns, r.namedRefused, r.describes)
	}
	if with.meanWhole <= without.meanWhole {
		t.Errorf("mean whole /28s with the /28-aware choice %.1f, without %.1f: want more with", with.meanWhole, without.meanWhole)
	}
	if *fragScatter && with.fallbackMean >= without.fallbackMean {
		t.Errorf("prefix-mode nodes held %.1f single addresses (fallback) on average with the /28-aware choice, %.1f without: want fewer with", with.fallbackMean, without.fallbackMean)
	}
}
