package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vpcip/vpcip/ipamd/introspect"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes tab-separated rows aligned into columns.
func table(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func itoa(n int) string { return fmt.Sprint(n) }

func nodeName(n introspect.NodeInfo) string {
	if n.Name != "" {
		return n.Name
	}
	return orDash(n.InstanceID)
}

func writeStatus(w io.Writer, s introspect.State) error {
	ready := map[bool]string{true: "yes", false: "no"}[s.Ready]
	if s.Reason != "" {
		ready += " (" + s.Reason + ")"
	}
	p := s.Pool
	rows := [][]string{
		{"Node:", nodeName(s.Node)},
		{"Instance:", fmt.Sprintf("%s (%s, %s)", orDash(s.Node.InstanceID), orDash(s.Node.InstanceType), orDash(s.Node.AvailabilityZone))},
		{"Primary IP:", addrString(s.Node.PrimaryIP.String())},
		{"Mode:", orDash(s.Node.Mode)},
		{"Ready:", ready},
		{"Addresses:", fmt.Sprintf("%d assigned, %d warm, %d cooling; capacity %d, budget %d", p.Assigned, p.Warm, p.Cooling, p.Capacity, p.Budget)},
		{"ENIs:", fmt.Sprintf("%d of %d", p.ENIs, p.MaxENIs)},
	}
	if pl := s.Placement; pl != nil { // where the latest new ENI went, and why
		placement := pl.Mode + ": " + pl.Reason
		if pl.Problem != "" {
			placement = pl.Mode + ": no ENI can be placed: " + pl.Problem
		}
		rows = append(rows, []string{"New ENIs:", placement})
	}
	rows = append(rows, []string{"Kubernetes:", kubernetesLine(s.Kubernetes)})
	return table(w, append(rows, []string{"Started:", stamp(s.Node.StartedAt)}))
}

// kubernetesLine is the Kubernetes part's state: connected, or why not.
func kubernetesLine(k introspect.Kubernetes) string {
	switch {
	case k.Connected:
		return "connected"
	case k.Reason != "":
		return k.Reason
	case k.Enabled:
		return "not connected"
	}
	return "disabled"
}

func addrString(s string) string {
	if s == "invalid IP" || s == "invalid Prefix" {
		return "-"
	}
	return s
}

// writeConfig lists the effective configuration (introspect.State.Config:
// variable name to value as the daemon parsed it; "-" for an unset one
// without a default), by name.
func writeConfig(w io.Writer, s introspect.State) error {
	rows := [][]string{{"VARIABLE", "VALUE"}}
	for _, k := range slices.Sorted(maps.Keys(s.Config)) {
		rows = append(rows, []string{k, orDash(s.Config[k])})
	}
	return table(w, rows)
}

func writePool(w io.Writer, s introspect.State) error {
	p := s.Pool
	return table(w, [][]string{
		{"ASSIGNED", "WARM", "COOLING", "CAPACITY", "BUDGET", "ENIS", "MAX ENIS"},
		{itoa(p.Assigned), itoa(p.Warm), itoa(p.Cooling), itoa(p.Capacity), itoa(p.Budget), itoa(p.ENIs), itoa(p.MaxENIs)},
	})
}

func writeENIs(w io.Writer, s introspect.State) error {
	assigned, cooling := map[string]int{}, map[string]int{}
	for _, a := range s.Assignments {
		assigned[a.ENIID]++
	}
	for _, c := range s.Cooling {
		cooling[c.ENIID]++
	}
	rows := [][]string{{"ENI", "DEVICE", "TABLE", "LINK", "PRIMARY IP", "SUBNET", "ADDRESSES", "ASSIGNED", "COOLING", "CAPACITY", "PREFIXES"}}
	for _, e := range s.ENIs {
		prefixes := make([]string, len(e.Prefixes))
		for i, p := range e.Prefixes {
			prefixes[i] = p.String()
		}
		rows = append(rows, []string{
			e.ID, itoa(e.DeviceNumber), itoa(e.RouteTable), orDash(e.LinkName),
			addrString(e.PrimaryIP.String()), addrString(e.SubnetCIDR.String()),
			itoa(len(e.Addresses)), itoa(assigned[e.ID]), itoa(cooling[e.ID]), itoa(e.Capacity),
			orDash(strings.Join(prefixes, ",")),
		})
	}
	return table(w, rows)
}

func podsJSON(s introspect.State) any {
	return introspect.Pods{Assignments: s.Assignments, Cooling: s.Cooling}
}

// shortID is the first 12 characters of a container ID, as runtimes print it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return orDash(id)
}

func writePods(w io.Writer, s introspect.State) error {
	rows := [][]string{{"NAMESPACE", "POD", "ADDRESS", "ENI", "CONTAINER", "IFNAME", "ASSIGNED"}}
	for _, a := range s.Assignments {
		rows = append(rows, []string{
			orDash(a.Pod.Namespace), orDash(a.Pod.Name), a.Address.String(), orDash(a.ENIID),
			shortID(a.Key.ContainerID), orDash(a.Key.IfName), stamp(a.AssignedAt),
		})
	}
	if err := table(w, rows); err != nil {
		return err
	}
	if len(s.Cooling) == 0 {
		return nil
	}
	rows = [][]string{{"COOLING", "ENI", "UNASSIGNED"}}
	for _, c := range s.Cooling {
		rows = append(rows, []string{c.Address.String(), orDash(c.ENIID), stamp(c.UnassignedAt)})
	}
	fmt.Fprintln(w)
	return table(w, rows)
}

// capacity is the JSON shape of `vpcipctl capacity`.
type capacity struct {
	Node      string `json:"node"`
	Addresses struct {
		Used     int `json:"used"`     // held by pods
		Warm     int `json:"warm"`     // free, ready to assign
		Cooling  int `json:"cooling"`  // released, in IP_COOLDOWN_PERIOD
		Capacity int `json:"capacity"` // what the attached ENIs could hold
		Budget   int `json:"budget"`   // what the node could hold at its ENI limit
	} `json:"addresses"`
	ENIs struct {
		Used int `json:"used"`
		Max  int `json:"max"`
	} `json:"enis"`
}

func capacityOf(s introspect.State) capacity {
	var c capacity
	c.Node = nodeName(s.Node)
	c.Addresses.Used, c.Addresses.Warm, c.Addresses.Cooling = s.Pool.Assigned, s.Pool.Warm, s.Pool.Cooling
	c.Addresses.Capacity, c.Addresses.Budget = s.Pool.Capacity, s.Pool.Budget
	c.ENIs.Used, c.ENIs.Max = s.Pool.ENIs, s.Pool.MaxENIs
	return c
}

// percent is part of whole in whole percent, rounded down; "-" without a whole.
func percent(part, whole int) string {
	if whole <= 0 {
		return "-"
	}
	return fmt.Sprintf("%d%%", part*100/whole)
}

func writeCapacity(w io.Writer, s introspect.State) error {
	c := capacityOf(s)
	a := c.Addresses
	return table(w, [][]string{
		{"NODE", "USED", "WARM", "COOLING", "CAPACITY", "BUDGET", "USED/BUDGET", "ENIS", "MAX ENIS"},
		{c.Node, itoa(a.Used), itoa(a.Warm), itoa(a.Cooling), itoa(a.Capacity), itoa(a.Budget), percent(a.Used, a.Budget), itoa(c.ENIs.Used), itoa(c.ENIs.Max)},
	})
}
