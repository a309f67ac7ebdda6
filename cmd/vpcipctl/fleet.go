package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
)

// fleet is `vpcipctl capacity --cluster`: every node's published
// AddressBudget, least headroom first, with totals per zone and per subnet.
// Counts are pod addresses (ENI primaries excluded), as on one node.
type fleet struct {
	Nodes   []fleetNode   `json:"nodes"`
	Zones   []fleetGroup  `json:"zones"`
	Subnets []fleetSubnet `json:"subnets"`
	Total   fleetGroup    `json:"total"`
}

type fleetNode struct {
	Name         string   `json:"name"`
	Zone         string   `json:"zone"`
	InstanceType string   `json:"instanceType"`
	Ready        bool     `json:"ready"`
	Used         int      `json:"used"`     // addresses held by pods
	Warm         int      `json:"warm"`     // free, ready to assign
	Cooling      int      `json:"cooling"`  // released, in IP_COOLDOWN_PERIOD
	Budget       int      `json:"budget"`   // what the node could hold at its ENI limit
	Headroom     int      `json:"headroom"` // Budget - Used: pods the node can still address
	UsedPercent  int      `json:"usedPercent"`
	ENIs         int      `json:"enis"`
	MaxENIs      int      `json:"maxENIs"`
	Subnets      []string `json:"subnets"`
}

// fleetGroup sums nodes: one zone, or the whole cluster (Name empty).
type fleetGroup struct {
	Name        string `json:"name,omitempty"`
	Nodes       int    `json:"nodes"`
	Used        int    `json:"used"`
	Budget      int    `json:"budget"`
	Headroom    int    `json:"headroom"`
	UsedPercent int    `json:"usedPercent"`
	SubnetFree  int    `json:"subnetFree"` // free addresses of the group's subnets, each counted once
}

type fleetSubnet struct {
	ID    string `json:"id"`
	CIDR  string `json:"cidr,omitempty"`
	Zone  string `json:"zone"`
	Free  int    `json:"free"`  // the lowest count any node published (the most recent drain)
	Nodes int    `json:"nodes"` // nodes with ENIs in it
	// FreePrefixes is how many aligned /28s of the subnet hold no address
	// (what prefix delegation can still get), the lowest count a node
	// published; nil when no node published one.
	FreePrefixes *int `json:"freePrefixes,omitempty"`
}

// fleetOf builds the view from the AddressBudgets, in any order.
func fleetOf(budgets []addressbudget.AddressBudget) fleet {
	f := fleet{Nodes: []fleetNode{}, Zones: []fleetGroup{}, Subnets: []fleetSubnet{}}
	subnets := map[string]*fleetSubnet{}
	for _, ab := range budgets {
		st := ab.Status
		n := fleetNode{
			Name: ab.Name, Zone: st.Zone, InstanceType: st.InstanceType, Ready: ready(st),
			Used: st.Addresses.Assigned, Warm: st.Addresses.Warm, Cooling: st.Addresses.Cooling,
			Budget: st.Addresses.Budget, Headroom: max(st.Addresses.Budget-st.Addresses.Assigned, 0),
			UsedPercent: addressbudget.Percent(st.Addresses.Assigned, st.Addresses.Budget),
			ENIs:        st.ENIs.Attached, MaxENIs: st.ENIs.Max, Subnets: []string{},
		}
		for _, s := range st.Subnets {
			n.Subnets = append(n.Subnets, s.ID)
			if have, ok := subnets[s.ID]; ok {
				have.Free, have.Nodes = min(have.Free, s.Free), have.Nodes+1
				if s.FreePrefixes != nil && (have.FreePrefixes == nil || *s.FreePrefixes < *have.FreePrefixes) {
					v := *s.FreePrefixes
					have.FreePrefixes = &v
				}
			} else {
				subnets[s.ID] = &fleetSubnet{ID: s.ID, CIDR: s.CIDR, Zone: st.Zone, Free: s.Free, Nodes: 1}
				if s.FreePrefixes != nil {
					v := *s.FreePrefixes
					subnets[s.ID].FreePrefixes = &v
				}
			}
		}
		f.Nodes = append(f.Nodes, n)
	}
	slices.SortFunc(f.Nodes, func(a, b fleetNode) int {
		return cmp.Or(cmp.Compare(a.Headroom, b.Headroom), cmp.Compare(b.UsedPercent, a.UsedPercent), strings.Compare(a.Name, b.Name))
	})
	for _, s := range subnets {
		f.Subnets = append(f.Subnets, *s)
	}
	slices.SortFunc(f.Subnets, func(a, b fleetSubnet) int {
		return cmp.Or(cmp.Compare(a.Free, b.Free), strings.Compare(a.ID, b.ID))
	})
	zones := map[string]*fleetGroup{}
	for _, n := range f.Nodes {
		z, ok := zones[n.Zone]
		if !ok {
			z = &fleetGroup{Name: n.Zone}
			zones[n.Zone] = z
		}
		for _, g := range []*fleetGroup{z, &f.Total} {
			g.Nodes, g.Used, g.Budget, g.Headroom = g.Nodes+1, g.Used+n.Used, g.Budget+n.Budget, g.Headroom+n.Headroom
		}
	}
	for _, s := range f.Subnets {
		f.Total.SubnetFree += s.Free
		if z, ok := zones[s.Zone]; ok {
			z.SubnetFree += s.Free
		}
	}
	for _, z := range zones {
		z.UsedPercent = addressbudget.Percent(z.Used, z.Budget)
		f.Zones = append(f.Zones, *z)
	}
	slices.SortFunc(f.Zones, func(a, b fleetGroup) int { return strings.Compare(a.Name, b.Name) })
	f.Total.UsedPercent = addressbudget.Percent(f.Total.Used, f.Total.Budget)
	return f
}

func ready(st addressbudget.Status) bool {
	for _, c := range st.Conditions {
		if c.Type == addressbudget.ConditionReady {
			return c.Status == "True"
		}
	}
	return false
}

// barWidth is the usage bar's length in characters.
const barWidth = 20

// bar draws used of budget as `[#####...............]`, rounding up so a
// node with any use shows one mark.
func bar(used, budget int) string {
	n := 0
	if budget > 0 {
		n = min((used*barWidth+budget-1)/budget, barWidth)
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", barWidth-n) + "]"
}

// writeFleet prints the nodes, then the zones, then the subnets, then the
// cluster's total.
func writeFleet(w io.Writer, f fleet) error {
	rows := [][]string{{"NODE", "ZONE", "TYPE", "USED/BUDGET", "HEADROOM", "USAGE", "", "ENIS", "READY"}}
	for _, n := range f.Nodes {
		rows = append(rows, []string{n.Name, orDash(n.Zone), orDash(n.InstanceType), fmt.Sprintf("%d/%d", n.Used, n.Budget),
			itoa(n.Headroom), bar(n.Used, n.Budget), fmt.Sprintf("%d%%", n.UsedPercent), fmt.Sprintf("%d/%d", n.ENIs, n.MaxENIs), yesNo(n.Ready)})
	}
	if err := table(w, rows); err != nil {
		return err
	}
	rows = [][]string{{"ZONE", "NODES", "USED/BUDGET", "HEADROOM", "USAGE", "", "SUBNET FREE"}}
	for _, z := range append(slices.Clone(f.Zones), f.Total) {
		name := z.Name
		if name == "" {
			name = "TOTAL"
		}
		rows = append(rows, []string{name, itoa(z.Nodes), fmt.Sprintf("%d/%d", z.Used, z.Budget), itoa(z.Headroom),
			bar(z.Used, z.Budget), fmt.Sprintf("%d%%", z.UsedPercent), itoa(z.SubnetFree)})
	}
	fmt.Fprintln(w)
	if err := table(w, rows); err != nil {
		return err
	}
	rows = [][]string{{"SUBNET", "ZONE", "CIDR", "FREE", "FREE /28S", "NODES"}}
	for _, s := range f.Subnets {
		prefixes := "-"
		if s.FreePrefixes != nil {
			prefixes = itoa(*s.FreePrefixes)
		}
		rows = append(rows, []string{s.ID, orDash(s.Zone), orDash(s.CIDR), itoa(s.Free), prefixes, itoa(s.Nodes)})
	}
	fmt.Fprintln(w)
	return table(w, rows)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
