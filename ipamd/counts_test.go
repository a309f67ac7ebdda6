package ipamd

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// TestCountRenderingsAgree: the pool's numbers are one api.Counts, and every
// rendering of them says the same, with custom networking off and on: the
// plugin API's status endpoint (over the socket), introspection's /v1/pool
// and /v1/state (what vpcipctl prints), the vpcip_* and awscni_* gauges, the
// snapshot the status sink gets and the AddressBudget status rendered from
// it. The ENI count is the pod ENIs', on the basis of MaxENIs: under custom
// networking the primary ENI, which holds no pod address, is counted in
// neither (api.Counts), so an m5.large (3 ENIs) shows at most 2/2 there and
// 3/3 otherwise, and the counts agree with the ENIs introspection lists.
func TestCountRenderingsAgree(t *testing.T) {
	for _, custom := range []bool{false, true} {
		t.Run(fmt.Sprintf("custom networking %v", custom), func(t *testing.T) {
			pods := netip.MustParsePrefix("100.64.16.0/20")
			c := startCloud(t,
				vpcsim.SubnetSpec{ID: "subnet-000000000000000a1", CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: "us-west-2a"},
				vpcsim.SubnetSpec{ID: "subnet-000000000000000a2", CIDR: pods, AvailabilityZone: "us-west-2a"})
			env := map[string]string{"WARM_IP_TARGET": "3", "IP_COOLDOWN_PERIOD": "600"}
			if custom {
				env["AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG"] = "true"
			}
			n := newNode(t, c, itypeSmall, env)
			if custom {
				n.wrap = func(p provider.Provider) provider.Provider {
					src := fixedENIConfig{Name: "pods", Subnet: "subnet-000000000000000a2"}
					return &podsubnet.Provider{Provider: p, Placer: podsubnet.NewPlacer(p, podsubnet.Settings{Custom: true}, src, nil, nil)}
				}
			}
			sink := &snapshots{}
			n.sink = sink
			n.start()
			for _, id := range names("c", 11) { // past one ENI's 9 pod addresses
				n.mustAdd(id)
			}
			n.del("c0") // one address cooling
			n.cycle()

			want := n.status().Counts // the socket API
			if err := want.Check(); err != nil {
				t.Fatalf("status counts %+v: %v", want, err)
			}
			st := n.d.State()
			wantMax, wantENIs := 3, len(st.ENIs)
			if custom {
				wantMax, wantENIs = 2, len(st.ENIs)-1
			}
			capacity := 0
			for _, e := range st.ENIs {
				if !custom || e.DeviceNumber > 0 {
					capacity += e.Capacity
				}
			}
			if want.MaxENIs != wantMax || want.ENIs != wantENIs || want.Capacity != capacity ||
				want.Assigned != 10 || want.Assigned != len(st.Assignments) || want.Cooling != 1 || want.Cooling != len(st.Cooling) {
				t.Errorf("counts %+v; want %d of %d pod ENIs, capacity %d (the ENIs' sum), 10 assigned, 1 cooling", want, wantENIs, wantMax, capacity)
			}

			renderings := map[string]api.Counts{}
			srv := httptest.NewServer(introspect.Handler(n.d.State))
			t.Cleanup(srv.Close)
			pool := getPool(t, srv.URL+"/v1/pool")
			renderings["introspection /v1/pool"] = pool
			var state introspect.State
			getJSON(t, srv.URL+"/v1/state", &state)
			renderings["introspection /v1/state"] = state.Pool
			renderings["vpcip_* gauges"] = api.Counts{
				Assigned: gaugeInt(t, n.reg, "vpcip_addresses_assigned"), Warm: gaugeInt(t, n.reg, "vpcip_addresses_warm"),
				Cooling: gaugeInt(t, n.reg, "vpcip_addresses_cooling"), Capacity: gaugeInt(t, n.reg, "vpcip_addresses_capacity"),
				Budget: gaugeInt(t, n.reg, "vpcip_addresses_budget"), ENIs: gaugeInt(t, n.reg, "vpcip_enis_attached"),
				MaxENIs: gaugeInt(t, n.reg, "vpcip_enis_max")}
			aws := prometheus.NewRegistry()
			fleetmetrics.RegisterAWSCNINames(aws, func() api.Counts { return n.d.Status().Counts }, func() []fleetmetrics.CIDRUse { return nil })
			renderings["awscni_* gauges"] = api.Counts{
				Assigned: gaugeInt(t, aws, "awscni_assigned_ip_addresses"), Budget: gaugeInt(t, aws, "awscni_ip_max"),
				ENIs: gaugeInt(t, aws, "awscni_eni_allocated"), MaxENIs: gaugeInt(t, aws, "awscni_eni_max"),
				// awscni_total_ip_addresses is assigned + warm + cooling
				Warm: gaugeInt(t, aws, "awscni_total_ip_addresses") - want.Assigned - want.Cooling, Cooling: want.Cooling, Capacity: want.Capacity}
			snap, _ := sink.last()
			renderings["status sink snapshot"] = snap.Status.Counts
			var ab addressbudget.Status
			ab.SetCounts(snap.Status.Counts)
			if err := ab.Check(); err != nil {
				t.Errorf("AddressBudget status: %v", err)
			}
			if ab.ENIs.Summary != fmt.Sprintf("%d/%d", want.ENIs, want.MaxENIs) || ab.UsedPercent != addressbudget.Percent(want.Assigned, want.Budget) ||
				ab.MaxPods.Addresses != want.Budget+addressbudget.HostNetworkAllowance {
				t.Errorf("AddressBudget ENIs %+v, used %d%%, max pods %d; want %d/%d, %d%%, %d", ab.ENIs, ab.UsedPercent, ab.MaxPods.Addresses,
					want.ENIs, want.MaxENIs, addressbudget.Percent(want.Assigned, want.Budget), want.Budget+addressbudget.HostNetworkAllowance)
			}
			renderings["AddressBudget status"] = api.Counts{Assigned: ab.Addresses.Assigned, Warm: ab.Addresses.Warm, Cooling: ab.Addresses.Cooling,
				Capacity: ab.Addresses.Capacity, Budget: ab.Addresses.Budget, ENIs: ab.ENIs.Attached, MaxENIs: ab.ENIs.Max}
			for _, name := range sortedKeys(renderings) {
				if got := renderings[name]; got != want {
					t.Errorf("%s renders %+v; the status endpoint %+v", name, got, want)
				}
			}
		})
	}
}

// TestCountsWireNames: the JSON names of the counts stay what the status
// endpoint, introspection and vpcipctl -o json have always shown.
func TestCountsWireNames(t *testing.T) {
	b, err := json.Marshal(api.Status{Version: "v", Ready: true, Counts: api.Counts{Assigned: 1, Warm: 2, Cooling: 3, Capacity: 4, ENIs: 5, MaxENIs: 6, Budget: 7}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"version":"v","ready":true,"assigned":1,"warm":2,"cooling":3,"capacity":4,"enis":5,"maxENIs":6,"budget":7}`
	if string(b) != want {
		t.Errorf("status JSON %s, want %s", b, want)
	}
}

func getPool(t *testing.T, url string) api.Counts {
	t.Helper()
	var raw map[string]int
	getJSON(t, url, &raw)
	if keys := sortedKeys(raw); !slices.Equal(keys, []string{"assigned", "budget", "capacity", "cooling", "enis", "maxENIs", "warm"}) {
		t.Errorf("/v1/pool has keys %v", keys)
	}
	return api.Counts{Assigned: raw["assigned"], Warm: raw["warm"], Cooling: raw["cooling"], Capacity: raw["capacity"],
		Budget: raw["budget"], ENIs: raw["enis"], MaxENIs: raw["maxENIs"]}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, b)
	}
}

func gaugeInt(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return int(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	t.Fatalf("gauge %s not gathered", name)
	return 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
