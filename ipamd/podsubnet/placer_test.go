package podsubnet_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/provider"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// The VPC: node subnets in 100.64.0.0/16, pod subnets in the secondary CIDR
// 100.65.0.0/16.
const (
	nodeA     = "subnet-00000000000000a01" // 100.64.0.0/26, us-west-2a: 59 usable
	podsA     = "subnet-00000000000000a02" // 100.65.0.0/24, us-west-2a, kubernetes.io/role/cni=1
	podsOff   = "subnet-00000000000000a03" // 100.65.4.0/22, us-west-2a, kubernetes.io/role/cni=0 (the largest)
	podsOther = "subnet-00000000000000a04" // 100.65.8.0/22, us-west-2a, tagged for another cluster
	podsA2    = "subnet-00000000000000a05" // 100.65.1.0/25, us-west-2a, kubernetes.io/role/cni=1: 123 usable
	podsB     = "subnet-00000000000000b02" // 100.65.32.0/24, us-west-2b, kubernetes.io/role/cni=1
	podSG     = "sg-000000000000000a1"
	podSG2    = "sg-000000000000000a2"
	cluster   = "blue"
)

func simConfig() vpcsim.Config {
	p := netip.MustParsePrefix
	cni := map[string]string{"kubernetes.io/role/cni": "1"}
	return vpcsim.Config{
		Seed:              3,
		SecondaryVPCCIDRs: []netip.Prefix{p("100.65.0.0/16")},
		Subnets: []vpcsim.SubnetSpec{
			{ID: nodeA, CIDR: p("100.64.0.0/26"), AvailabilityZone: "us-west-2a"},
			{ID: podsA, CIDR: p("100.65.0.0/24"), AvailabilityZone: "us-west-2a", Tags: cni},
			{ID: podsOff, CIDR: p("100.65.4.0/22"), AvailabilityZone: "us-west-2a", Tags: map[string]string{"kubernetes.io/role/cni": "0"}},
			{ID: podsOther, CIDR: p("100.65.8.0/22"), AvailabilityZone: "us-west-2a",
				Tags: map[string]string{"kubernetes.io/role/cni": "1", "kubernetes.io/cluster/green": "owned"}},
			{ID: podsA2, CIDR: p("100.65.1.0/25"), AvailabilityZone: "us-west-2a", Tags: cni},
			{ID: podsB, CIDR: p("100.65.32.0/24"), AvailabilityZone: "us-west-2b", Tags: cni},
		},
		SecurityGroups: []vpcsim.SecurityGroupSpec{{ID: podSG, Name: "pods"}, {ID: podSG2, Name: "pods-2"}},
	}
}

// node is one instance with the real EC2 provider bound to it.
type node struct {
	sim  *vpcsimtest.Local
	inst vpcsim.InstanceInfo
	prov *awsprovider.Client
	logs *syncBuffer
	log  *slog.Logger
}

func startNode(t *testing.T, budget ...provider.RequestBudget) *node {
	t.Helper()
	l := vpcsimtest.Start(t, simConfig())
	inst, err := l.Cloud.LaunchInstance("m5.large", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadDefaultConfig(context.Background(), config.WithRegion("us-west-2"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")),
		config.WithBaseEndpoint(l.EC2URL), config.WithEC2IMDSEndpoint(l.IMDSURL(inst.ID)),
		config.WithSharedConfigFiles([]string{}), config.WithSharedCredentialsFiles([]string{}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := awsprovider.New(context.Background(), awsprovider.Options{
		ClusterName: cluster, AWSConfig: &cfg, MutatingRate: 1000, MutatingBurst: 100, DescribeRate: 1000, DescribeBurst: 100,
		MetadataWait: 5 * time.Second, MetadataPoll: 10 * time.Millisecond, RetryBase: time.Millisecond, RetryMax: 10 * time.Millisecond,
		Budget: append(budget, nil)[0],
	})
	if err != nil {
		t.Fatal(err)
	}
	buf := &syncBuffer{}
	return &node{sim: l, inst: inst, prov: p, logs: buf, log: slog.New(slog.NewTextHandler(buf, nil))}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (n *node) create(t *testing.T, w *podsubnet.Provider) provider.ENI {
	t.Helper()
	e, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 9})
	if err != nil {
		t.Fatalf("CreateENI: %v\nlog:\n%s", err, n.logs)
	}
	return e
}

// TestDiscoveryPicksTaggedSubnet: with the node's subnet nearly full, new
// ENIs go to the tagged subnet with the most free addresses, never to the
// cni=0 subnet or another cluster's (though both are larger), with the
// primary ENI's security groups; the choice is logged with free counts.
func TestDiscoveryPicksTaggedSubnet(t *testing.T) {
	n := startNode(t)
	if _, err := n.sim.Cloud.HoldAddresses(nodeA, 50); err != nil {
		t.Fatal(err)
	}
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Discovery: true, Cluster: cluster}, nil, n.log, nil)
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	first := n.create(t, w)
	second := n.create(t, w)
	for i, e := range []provider.ENI{first, second} { // m5.large: 2 ENIs besides the primary
		got, _ := n.sim.Cloud.NetworkInterface(e.ID)
		if got.SubnetID != podsA || !slices.Equal(got.SecurityGroups, n.inst.PrimaryENI.SecurityGroups) {
			t.Errorf("ENI %d in %s with groups %v, want %s with the primary ENI's %v", i+1, got.SubnetID, got.SecurityGroups, podsA, n.inst.PrimaryENI.SecurityGroups)
		}
		if !netip.MustParsePrefix("100.65.0.0/24").Contains(e.PrimaryIP) || e.SubnetCIDR.String() != "100.65.0.0/24" {
			t.Errorf("ENI %d: primary %v in %v", i+1, e.PrimaryIP, e.SubnetCIDR)
		}
	}
	d := pl.Last()
	if d.Mode != podsubnet.ModeDiscovery || len(d.Targets) != 3 || d.Targets[0].Free != 241 || d.Targets[0].SubnetID != podsA || d.Targets[1].SubnetID != podsA2 || d.Targets[2].SubnetID != nodeA {
		t.Errorf("last decision %+v: want targets podsA, podsA2, node subnet", d)
	}
	for _, want := range []string{"subnet=" + podsA, "free=", podsOff + "(100.65.4.0/22, 1019 free, tagged kubernetes.io/role/cni=0: skipped)",
		podsOther + "(100.65.8.0/22, 1019 free, tagged for cluster green, not blue: skipped)", nodeA + "(100.64.0.0/26, 8 free, node subnet)"} {
		if !strings.Contains(n.logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, n.logs)
		}
	}
	for _, id := range []string{podsOff, podsOther, podsB} {
		for _, e := range n.sim.Cloud.NetworkInterfaces() {
			if e.SubnetID == id {
				t.Errorf("an ENI went to %s", id)
			}
		}
	}
}

// TestDiscoveryFallsToNextWhenRefused: when EC2 refuses the best subnet as
// full (it filled since the listing), the ENI goes to the next one.
func TestDiscoveryFallsToNextWhenRefused(t *testing.T) {
	n := startNode(t)
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Discovery: true, Cluster: cluster}, nil, n.log, nil)
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	n.sim.Cloud.Faults().FailNext("CreateNetworkInterface", "InsufficientFreeAddressesInSubnet")
	e := n.create(t, w)
	if got, _ := n.sim.Cloud.NetworkInterface(e.ID); got.SubnetID != podsA2 {
		t.Errorf("after podsA refused, the ENI went to %s, want %s", got.SubnetID, podsA2)
	}
	if !strings.Contains(n.logs.String(), "subnet refused the new ENI: trying the next") {
		t.Errorf("the refusal is not logged:\n%s", n.logs)
	}
	// Every subnet full: the refusal reaches the pool as ErrSubnetFull.
	for _, id := range []string{nodeA, podsA, podsA2} {
		s, _ := n.sim.Cloud.Subnet(id)
		if _, err := n.sim.Cloud.HoldAddresses(id, s.FreeAddresses); err != nil {
			t.Fatal(err)
		}
	}
	_, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1})
	if !errors.Is(err, provider.ErrSubnetFull) {
		t.Errorf("every subnet full: err = %v, want ErrSubnetFull", err)
	}
}

// TestNoDiscovery: with discovery and custom networking off, ENIs stay in
// the node's subnet even when a tagged subnet has more room.
func TestNoDiscovery(t *testing.T) {
	n := startNode(t)
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Cluster: cluster}, nil, n.log, nil)
	e := n.create(t, &podsubnet.Provider{Provider: n.prov, Placer: pl})
	if got, _ := n.sim.Cloud.NetworkInterface(e.ID); got.SubnetID != nodeA {
		t.Errorf("ENI in %s, want the node subnet", got.SubnetID)
	}
}

// source is the node's ENIConfig as the Kubernetes part would supply it.
type source struct {
	mu  sync.Mutex
	cfg podsubnet.ENIConfig
	err error
}

func (s *source) set(cfg podsubnet.ENIConfig, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.err = cfg, err
}

func (s *source) NodeENIConfig() (podsubnet.ENIConfig, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg, "label k8s.amazonaws.com/eniConfig", s.err
}

// TestCustomNetworking: ENIs go to the ENIConfig's subnet with its security
// groups as EC2 reports them; a missing or invalid ENIConfig is an error
// that names it (reported once per change), and no ENI is made; changing the
// ENIConfig moves only new ENIs.
func TestCustomNetworking(t *testing.T) {
	n := startNode(t)
	src := &source{}
	var problems []string
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Custom: true, Discovery: true, Cluster: cluster}, src, n.log,
		func(reason, msg, _ string) { problems = append(problems, reason+": "+msg) })
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	before := len(n.sim.Cloud.NetworkInterfaces())

	src.set(podsubnet.ENIConfig{Name: "us-west-2a"}, podsubnet.ErrNoENIConfig)
	for range 2 {
		if _, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1}); !errors.Is(err, podsubnet.ErrNoENIConfig) {
			t.Fatalf("missing ENIConfig: err = %v", err)
		}
	}
	for _, tt := range []struct {
		cfg  podsubnet.ENIConfig
		want string
	}{
		{podsubnet.ENIConfig{Name: "zone-b", Subnet: podsB}, "is in zone us-west-2b"},
		{podsubnet.ENIConfig{Name: "gone", Subnet: "subnet-0000000000000dead"}, "does not exist"},
		{podsubnet.ENIConfig{Name: "bad-sg", Subnet: podsA, SecurityGroups: []string{"sg-0000000000000dead"}}, "EC2 refused its subnet or security groups"},
	} {
		src.set(tt.cfg, nil)
		_, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1})
		if !errors.Is(err, podsubnet.ErrInvalidENIConfig) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.cfg.Name) {
			t.Errorf("ENIConfig %+v: err = %v, want ErrInvalidENIConfig saying %q", tt.cfg, err, tt.want)
		}
		if p := pl.Last().Problem; !strings.Contains(p, tt.want) {
			t.Errorf("ENIConfig %s: last decision's problem %q", tt.cfg.Name, p)
		}
	}
	if got := len(n.sim.Cloud.NetworkInterfaces()); got != before {
		t.Fatalf("%d ENIs made without a valid ENIConfig", got-before)
	}
	// A retry loop on an unchanged invalid ENIConfig asks EC2 once per RetryAfter.
	calls := n.sim.Cloud.Faults().Calls("DescribeSubnets")
	for range 5 {
		if _, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1}); !errors.Is(err, podsubnet.ErrInvalidENIConfig) {
			t.Fatalf("repeated: %v", err)
		}
	}
	if got := n.sim.Cloud.Faults().Calls("DescribeSubnets") - calls; got != 0 {
		t.Errorf("5 retries within RetryAfter made %d DescribeSubnets calls, want 0", got)
	}
	if len(problems) != 4 || !strings.HasPrefix(problems[0], "ENIConfigNotFound") || !strings.HasPrefix(problems[1], "ENIConfigInvalid") {
		t.Errorf("problems reported: %q; want one per change", problems)
	}

	src.set(podsubnet.ENIConfig{Name: "us-west-2a", Subnet: podsA2, SecurityGroups: []string{podSG, podSG2}}, nil)
	old := n.create(t, w)
	got, _ := n.sim.Cloud.NetworkInterface(old.ID)
	if got.SubnetID != podsA2 || !slices.Equal(got.SecurityGroups, []string{podSG, podSG2}) {
		t.Errorf("ENI in %s with %v, want %s with %s,%s", got.SubnetID, got.SecurityGroups, podsA2, podSG, podSG2)
	}
	if d := pl.Last(); d.Problem != "" || d.ENIConfig != "us-west-2a" || !strings.Contains(d.Reason, "123 free") {
		t.Errorf("decision %+v", d)
	}
	src.set(podsubnet.ENIConfig{Name: "other", Subnet: podsA}, nil)
	moved := n.create(t, w)
	if got, _ := n.sim.Cloud.NetworkInterface(moved.ID); got.SubnetID != podsA || !slices.Equal(got.SecurityGroups, n.inst.PrimaryENI.SecurityGroups) {
		t.Errorf("after the change: ENI in %s with %v, want %s with the primary ENI's groups", got.SubnetID, got.SecurityGroups, podsA)
	}
	if got, _ := n.sim.Cloud.NetworkInterface(old.ID); got.SubnetID != podsA2 || got.Status != "in-use" {
		t.Errorf("the earlier ENI changed: %+v", got)
	}
}

// deferringBudget has no room for the first n CreateNetworkInterface
// requests (a fleet's shared budget answering "later"), then lets all through.
type deferringBudget struct {
	mu sync.Mutex
	n  int
}

func (b *deferringBudget) Take(_ context.Context, action string, p provider.Priority) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if action == "CreateNetworkInterface" && b.n > 0 {
		b.n--
		return &provider.BudgetShortError{Action: action, Priority: p, Wait: 100 * time.Millisecond}
	}
	return nil
}

func (*deferringBudget) Refused(string) {}

// TestDeferredCreateKeepsItsPlacement: a create the fleet's EC2 budget
// defers (nothing sent) keeps its placement for the next try, which then
// reads no subnets again; the ENI lands where the first decision said.
func TestDeferredCreateKeepsItsPlacement(t *testing.T) {
	n := startNode(t, &deferringBudget{n: 3})
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Discovery: true, Cluster: cluster}, nil, n.log, nil)
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	var short *provider.BudgetShortError
	if _, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 9}); !errors.As(err, &short) {
		t.Fatalf("first create: %v, want the budget's deferral", err)
	}
	described := n.sim.Cloud.Faults().Calls("DescribeSubnets")
	for range 2 {
		if _, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 9}); !errors.As(err, &short) {
			t.Fatalf("deferred create: %v, want the budget's deferral", err)
		}
	}
	e := n.create(t, w)
	if got := n.sim.Cloud.Faults().Calls("DescribeSubnets") - described; got != 0 {
		t.Errorf("%d DescribeSubnets for three tries of a deferred create, want none", got)
	}
	if got, _ := n.sim.Cloud.NetworkInterface(e.ID); got.SubnetID != podsA {
		t.Errorf("the ENI went to %s, want %s (the first decision)", got.SubnetID, podsA)
	}
}

// TestDeferredCreateFollowsAnENIConfigChange: a placement kept for a
// create the budget deferred is not used once the node's ENIConfig has
// changed: the next ENI goes where the new ENIConfig says.
func TestDeferredCreateFollowsAnENIConfigChange(t *testing.T) {
	n := startNode(t, &deferringBudget{n: 1})
	src := &source{}
	src.set(podsubnet.ENIConfig{Name: "old", Subnet: podsA2, SecurityGroups: []string{podSG2}}, nil)
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Custom: true, Cluster: cluster}, src, n.log, nil)
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	var short *provider.BudgetShortError
	if _, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2}); !errors.As(err, &short) {
		t.Fatalf("first create: %v, want the budget's deferral", err)
	}
	src.set(podsubnet.ENIConfig{Name: "new", Subnet: podsA, SecurityGroups: []string{podSG}}, nil)
	e := n.create(t, w)
	got, _ := n.sim.Cloud.NetworkInterface(e.ID)
	if got.SubnetID != podsA || !slices.Equal(got.SecurityGroups, []string{podSG}) {
		t.Errorf("after the ENIConfig changed: ENI in %s with %v, want %s with %s (the new ENIConfig)", got.SubnetID, got.SecurityGroups, podsA, podSG)
	}
}

// hookBudget calls on(k) at the k-th (1-based) CreateNetworkInterface take
// and defers that take when on returns true.
type hookBudget struct {
	mu sync.Mutex
	k  int
	on func(k int) bool
}

func (b *hookBudget) Take(_ context.Context, action string, p provider.Priority) error {
	if action != "CreateNetworkInterface" {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.k++
	if b.on(b.k) {
		return &provider.BudgetShortError{Action: action, Priority: p, Wait: 100 * time.Millisecond}
	}
	return nil
}

func (*hookBudget) Refused(string) {}

// TestDeferredCreateSkipsTargetsThatRefused: when the budget defers the
// create on the second target after the first refused it as full, the next
// try starts at the second target: no request goes to the full subnet again.
func TestDeferredCreateSkipsTargetsThatRefused(t *testing.T) {
	var n *node
	n = startNode(t, &hookBudget{on: func(k int) bool {
		if k != 2 {
			return false
		}
		// podsA refused the first create; it is full from now on.
		s, _ := n.sim.Cloud.Subnet(podsA)
		if _, err := n.sim.Cloud.HoldAddresses(podsA, s.FreeAddresses); err != nil {
			t.Error(err)
		}
		return true
	}})
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Discovery: true, Cluster: cluster}, nil, n.log, nil)
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	n.sim.Cloud.Faults().FailNext("CreateNetworkInterface", "InsufficientFreeAddressesInSubnet")
	var short *provider.BudgetShortError
	if _, err := w.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2}); !errors.As(err, &short) {
		t.Fatalf("first create: %v, want the budget's deferral", err)
	}
	e := n.create(t, w)
	if got, _ := n.sim.Cloud.NetworkInterface(e.ID); got.SubnetID != podsA2 {
		t.Errorf("the ENI went to %s, want %s", got.SubnetID, podsA2)
	}
	if got := n.sim.Cloud.Faults().Calls("CreateNetworkInterface"); got != 2 {
		t.Errorf("%d CreateNetworkInterface requests, want 2 (podsA's refusal, then podsA2's ENI)", got)
	}
}

// queueingBudget holds the first CreateNetworkInterface request 1.2 s in
// the fleet's queue (a provider.RequestReserver: the create, made under
// provider.WithDeferral, is deferred with its place held); everything else
// goes at once.
type queueingBudget struct {
	mu      sync.Mutex
	creates int
}

func (b *queueingBudget) Reserve(_ context.Context, action string, _ provider.Priority) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if action == "CreateNetworkInterface" {
		b.creates++
		if b.creates == 1 {
			return 1200 * time.Millisecond, nil
		}
	}
	return 0, nil
}

func (b *queueingBudget) Take(ctx context.Context, action string, p provider.Priority) error {
	wait, err := b.Reserve(ctx, action, p)
	if err != nil {
		return err
	}
	return provider.Sleep(ctx, wait)
}

func (*queueingBudget) Refused(string) {}

// TestCreateDeferredInTheQueueKeepsItsPlacement: a create whose place in
// the fleet's queue is held (provider.DeferredError, nothing sent) keeps
// its placement as one the budget had no room for does: made when due, it
// reads no subnets again and lands where the first decision said. Before,
// the deferred create's decision was dropped and the call made when due
// placed anew (a DescribeSubnets per deferred create).
func TestCreateDeferredInTheQueueKeepsItsPlacement(t *testing.T) {
	budget := &queueingBudget{}
	n := startNode(t, budget)
	pl := podsubnet.NewPlacer(n.prov, podsubnet.Settings{Discovery: true, Cluster: cluster}, nil, n.log, nil)
	w := &podsubnet.Provider{Provider: n.prov, Placer: pl}
	ctx := provider.WithDeferral(provider.WithPriority(t.Context(), provider.PriorityPodWaiting))
	_, err := w.CreateENI(ctx, provider.CreateENIRequest{Addresses: 9})
	var d *provider.DeferredError
	if !errors.As(err, &d) {
		t.Fatalf("first create: %v, want it deferred in the queue", err)
	}
	described := n.sim.Cloud.Faults().Calls("DescribeSubnets")
	time.Sleep(time.Until(d.Until))
	e, err := w.CreateENI(ctx, provider.CreateENIRequest{Addresses: 9})
	if err != nil {
		t.Fatalf("create when due: %v\nlog:\n%s", err, n.logs)
	}
	if got := n.sim.Cloud.Faults().Calls("DescribeSubnets") - described; got != 0 {
		t.Errorf("%d DescribeSubnets for the deferred create made when due, want none", got)
	}
	if got, _ := n.sim.Cloud.NetworkInterface(e.ID); got.SubnetID != podsA {
		t.Errorf("the ENI went to %s, want %s (the first decision)", got.SubnetID, podsA)
	}
	budget.mu.Lock()
	defer budget.mu.Unlock()
	if budget.creates != 1 {
		t.Errorf("%d create places taken, want 1 (the one held)", budget.creates)
	}
}
