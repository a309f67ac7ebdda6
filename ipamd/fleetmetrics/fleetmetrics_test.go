package fleetmetrics

import (
	"log/slog"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/provider"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// sample reads one gauge sample with exactly these labels; ok false if absent.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestSubnetsFollowEC2: the subnet gauges show what EC2 DescribeSubnets
// says (through aws-sdk-go-v2 against vpcsim), and follow assignments at the
// next refresh.
func TestSubnetsFollowEC2(t *testing.T) {
	sim := vpcsimtest.Start(t, vpcsim.Config{Subnets: []vpcsim.SubnetSpec{
		{ID: "subnet-small", CIDR: netip.MustParsePrefix("100.64.0.0/27"), AvailabilityZone: "us-west-2a"},
	}})
	inst := sim.Launch(t, "t3.small")
	dir := t.TempDir()
	for _, kv := range append(sim.Env(inst.ID), "AWS_CONFIG_FILE="+filepath.Join(dir, "c"), "AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(dir, "s")) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	prov, err := awsprovider.New(t.Context(), awsprovider.Options{ClusterName: "fleetmetrics"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := NewSubnets(reg, prov, 0, slog.New(slog.DiscardHandler))
	if err := s.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"subnet_id": "subnet-small", "availability_zone": "us-west-2a"}
	want, _ := sim.Cloud.Subnet("subnet-small")
	if got, ok := sample(t, reg, "vpcip_subnet_free_addresses", labels); !ok || int(got) != want.FreeAddresses {
		t.Errorf("free = %v (present %v), want EC2's %d", got, ok, want.FreeAddresses)
	}
	if got, _ := sample(t, reg, "vpcip_subnet_usable_addresses", labels); got != 27 {
		t.Errorf("usable = %v, want 27 (a /27 less the 5 AWS reserves)", got)
	}
	// A /27: .0/28 holds the reserved addresses, .16/28 the broadcast.
	if got, ok := sample(t, reg, "vpcip_subnet_free_prefixes", labels); !ok || got != 0 {
		t.Errorf("free prefixes of a /27 = %v (present %v), want 0", got, ok)
	}
	if _, err := prov.AssignAddresses(t.Context(), inst.PrimaryENI.ID, 3, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, _ := sample(t, reg, "vpcip_subnet_free_addresses", labels); int(got) != want.FreeAddresses-3 {
		t.Errorf("free after assigning 3 = %v, want %d", got, want.FreeAddresses-3)
	}
	latest, at := s.Latest()
	if len(latest) != 1 || latest[0].ID != "subnet-small" || latest[0].FreeAddresses != want.FreeAddresses-3 || at.IsZero() {
		t.Errorf("Latest() = %+v at %v", latest, at)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestSubnetFreePrefixesFollowEC2: vpcip_subnet_free_prefixes is the
// subnet's whole aligned /28s as vpcsim models them (through
// aws-sdk-go-v2), and drops when a single address breaks one.
func TestSubnetFreePrefixesFollowEC2(t *testing.T) {
	sim := vpcsimtest.Start(t, vpcsim.Config{Subnets: []vpcsim.SubnetSpec{
		{ID: "subnet-frag", CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: "us-west-2a"},
	}})
	inst := sim.Launch(t, "m5.large")
	dir := t.TempDir()
	for _, kv := range append(sim.Env(inst.ID), "AWS_CONFIG_FILE="+filepath.Join(dir, "c"), "AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(dir, "s")) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	prov, err := awsprovider.New(t.Context(), awsprovider.Options{ClusterName: "fleetmetrics"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := NewSubnets(reg, prov, 0, slog.New(slog.DiscardHandler))
	labels := map[string]string{"subnet_id": "subnet-frag", "availability_zone": "us-west-2a"}
	check := func(when string) {
		t.Helper()
		if err := s.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		want, _ := sim.Cloud.Subnet("subnet-frag")
		if got, ok := sample(t, reg, "vpcip_subnet_free_prefixes", labels); !ok || int(got) != want.FreePrefixes {
			t.Errorf("%s: free prefixes = %v (present %v), want vpcsim's %d", when, got, ok, want.FreePrefixes)
		}
		// The same count for the AddressBudget, from the same read.
		if latest, _ := s.Latest(); len(latest) != 1 || latest[0].FreePrefixes == nil || *latest[0].FreePrefixes != want.FreePrefixes {
			t.Errorf("%s: Latest() = %+v, want FreePrefixes %d", when, latest, want.FreePrefixes)
		}
	}
	check("fresh") // 16 /28s, less the reserved ones' (primary .4 shares one)
	if _, err := prov.AssignAddressesAt(t.Context(), inst.PrimaryENI.ID, []netip.Addr{netip.MustParseAddr("100.64.0.100")}); err != nil {
		t.Fatal(err)
	}
	check("one address in .96/28")
	if _, err := prov.AssignAddresses(t.Context(), inst.PrimaryENI.ID, 1, true); err != nil {
		t.Fatal(err)
	}
	check("one /28 delegated")
	if s, _ := sim.Cloud.Subnet("subnet-frag"); s.FreePrefixes != 12 {
		t.Errorf("setup: vpcsim shows %d whole /28s, want 12", s.FreePrefixes)
	}
}

func TestWholePrefixes(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		cidr string
		used []netip.Prefix
		want int
	}{
		{"10.0.0.0/24", nil, 14},
		{"10.0.0.0/24", []netip.Prefix{p("10.0.0.4/32"), p("10.0.0.250/32")}, 14}, // in the reserved blocks
		{"10.0.0.0/24", []netip.Prefix{p("10.0.0.17/32"), p("10.0.0.18/32"), p("10.0.0.32/28"), p("10.0.1.5/32")}, 12},
		{"10.0.0.0/28", nil, 0},
		{"10.0.0.0/30", nil, 0},
	} {
		if got := WholePrefixes(p(tc.cidr), tc.used); got != tc.want {
			t.Errorf("WholePrefixes(%s, %v) = %d, want %d", tc.cidr, tc.used, got, tc.want)
		}
	}
}

func TestUsable(t *testing.T) {
	for _, tc := range []struct {
		cidr string
		want int
	}{{"10.0.0.0/16", 65531}, {"10.0.0.0/28", 11}, {"10.0.0.0/30", 0}} {
		if got := Usable(provider.Subnet{CIDR: netip.MustParsePrefix(tc.cidr)}); got != tc.want {
			t.Errorf("Usable(%s) = %d, want %d", tc.cidr, got, tc.want)
		}
	}
}

// TestAWSCNINames: the reference's gauges carry the reference's meanings,
// computed from the pool counts of each scrape.
func TestAWSCNINames(t *testing.T) {
	st := api.Counts{Assigned: 7, Warm: 3, Cooling: 2, Capacity: 18, Budget: 27, ENIs: 2, MaxENIs: 3}
	reg := prometheus.NewRegistry()
	RegisterAWSCNINames(reg, func() api.Counts { return st }, func() []CIDRUse { return nil })
	want := map[string]float64{
		"awscni_assigned_ip_addresses": 7,
		"awscni_total_ip_addresses":    12, // assigned + warm + cooling
		"awscni_ip_max":                27,
		"awscni_eni_allocated":         2,
		"awscni_eni_max":               3,
	}
	for name, v := range want {
		if got, ok := sample(t, reg, name, nil); !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, v)
		}
	}
	st.Assigned, st.Warm = 8, 2
	if got, _ := sample(t, reg, "awscni_assigned_ip_addresses", nil); got != 8 {
		t.Errorf("awscni_assigned_ip_addresses after an ADD = %v, want 8", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestBuildInfoAndWithoutPod(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterBuildInfo(reg, "1.2.3", 1)
	w := NewWithoutPod(reg)
	labels := map[string]string{"version": "1.2.3", "go_version": runtime.Version(), "checkpoint_schema": "1"}
	if got, ok := sample(t, reg, "vpcip_build_info", labels); !ok || got != 1 {
		t.Errorf("vpcip_build_info%v = %v (present %v), want 1", labels, got, ok)
	}
	if got, ok := sample(t, reg, "vpcip_addresses_without_pod", nil); !ok || got != 0 {
		t.Errorf("without pod before Set = %v (present %v), want 0", got, ok)
	}
	w.Set(4)
	if got, _ := sample(t, reg, "vpcip_addresses_without_pod", nil); got != 4 {
		t.Errorf("without pod after Set(4) = %v", got)
	}
	var none *WithoutPod
	none.Set(1) // no Kubernetes part: a nil gauge ignores it
}
