package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
)

// budgetOf is one node's AddressBudget as its daemon publishes it.
func budgetOf(node, zone string, used, budget, enis, maxENIs int, ready bool, subnets ...addressbudget.Subnet) addressbudget.AddressBudget {
	ab := addressbudget.AddressBudget{}
	ab.Name = node
	cond := metav1.ConditionFalse
	if ready {
		cond = metav1.ConditionTrue
	}
	ab.Status = addressbudget.Status{
		InstanceType: "m5.large", Zone: zone,
		ENIs:        addressbudget.ENIs{Attached: enis, Max: maxENIs},
		Addresses:   addressbudget.Addresses{Assigned: used, Warm: 1, Capacity: used + 1, Budget: budget},
		UsedPercent: addressbudget.Percent(used, budget),
		Subnets:     subnets,
		Conditions:  []metav1.Condition{{Type: addressbudget.ConditionReady, Status: cond}},
	}
	return ab
}

// testFleet: three nodes in two zones, two of them sharing a subnet whose
// free addresses and whole free /28s they saw at different times; the
// third node's subnet has no /28 count (a daemon that never read one).
func testFleet() []addressbudget.AddressBudget {
	a := addressbudget.Subnet{ID: "subnet-a", CIDR: "10.0.0.0/24", Free: 40, FreePrefixes: new(2)}
	aLater := a
	aLater.Free, aLater.FreePrefixes = 30, new(1)
	b := addressbudget.Subnet{ID: "subnet-b", CIDR: "10.0.1.0/24", Free: 200}
	return []addressbudget.AddressBudget{
		budgetOf("node-roomy", "us-west-2a", 3, 27, 1, 3, true, a),
		budgetOf("node-full", "us-west-2a", 27, 27, 3, 3, true, aLater),
		budgetOf("node-half", "us-west-2b", 10, 20, 2, 3, false, b),
	}
}

func TestFleetOf(t *testing.T) {
	f := fleetOf(testFleet())
	var order []string
	for _, n := range f.Nodes {
		order = append(order, n.Name)
	}
	if diff := cmp.Diff([]string{"node-full", "node-half", "node-roomy"}, order); diff != "" {
		t.Errorf("nodes not sorted by headroom (-want +got):\n%s", diff)
	}
	if n := f.Nodes[0]; n.Headroom != 0 || n.UsedPercent != 100 || !n.Ready || n.ENIs != 3 {
		t.Errorf("node-full: %+v", n)
	}
	if f.Nodes[1].Ready {
		t.Error("node-half shown ready though its Ready condition is False")
	}
	wantZones := []fleetGroup{
		{Name: "us-west-2a", Nodes: 2, Used: 30, Budget: 54, Headroom: 24, UsedPercent: 55, SubnetFree: 30},
		{Name: "us-west-2b", Nodes: 1, Used: 10, Budget: 20, Headroom: 10, UsedPercent: 50, SubnetFree: 200},
	}
	if diff := cmp.Diff(wantZones, f.Zones); diff != "" {
		t.Errorf("zones (-want +got):\n%s", diff)
	}
	wantSubnets := []fleetSubnet{
		{ID: "subnet-a", CIDR: "10.0.0.0/24", Zone: "us-west-2a", Free: 30, Nodes: 2, FreePrefixes: new(1)}, // the lower, later counts
		{ID: "subnet-b", CIDR: "10.0.1.0/24", Zone: "us-west-2b", Free: 200, Nodes: 1},
	}
	if diff := cmp.Diff(wantSubnets, f.Subnets); diff != "" {
		t.Errorf("subnets (-want +got):\n%s", diff)
	}
	if want := (fleetGroup{Nodes: 3, Used: 40, Budget: 74, Headroom: 34, UsedPercent: 54, SubnetFree: 230}); f.Total != want {
		t.Errorf("total %+v, want %+v", f.Total, want)
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		used, budget int
		want         string
	}{
		{0, 27, "[....................]"},
		{1, 27, "[#...................]"}, // any use shows
		{27, 27, "[####################]"},
		{10, 20, "[##########..........]"},
		{5, 0, "[....................]"}, // no budget published yet
	} {
		if got := bar(tc.used, tc.budget); got != tc.want {
			t.Errorf("bar(%d, %d) = %s, want %s", tc.used, tc.budget, got, tc.want)
		}
	}
}

func TestWriteFleet(t *testing.T) {
	var b bytes.Buffer
	if err := writeFleetAs(&b, fleetOf(testFleet()), "table"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	for i, want := range []string{
		"NODE        ZONE        TYPE      USED/BUDGET  HEADROOM  USAGE                         ENIS  READY",
		"node-full   us-west-2a  m5.large  27/27        0         [####################]  100%  3/3   yes",
	} {
		if strings.TrimRight(lines[i], " ") != want {
			t.Errorf("line %d:\n got %q\nwant %q", i, lines[i], want)
		}
	}
	for _, want := range []string{"TOTAL       3      40/74", "subnet-a  us-west-2a  10.0.0.0/24  30    1          2", "subnet-b  us-west-2b  10.0.1.0/24  200   -          1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := writeFleetAs(&b, fleetOf(testFleet()), "yaml"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "- budget: 27\n  cooling: 0\n  enis: 3\n") {
		t.Errorf("yaml output:\n%s", b.String())
	}
}
