package cluster

import (
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/provider"
)

// Source is the part of a running vpcipd (ipamd.Daemon) the adapter reads and
// drives: its introspection state and its release of an attachment.
type Source interface {
	State() introspect.State
	Release(req api.ReleaseRequest) (api.ReleaseResponse, error)
	PodsHolding() map[string]bool // "namespace/name" of pods holding an address
	// FenceHeld keeps addr from being handed out, even once released,
	// until unfence is called; ok is false, fencing nothing, when key does
	// not hold addr.
	FenceHeld(key api.Key, addr netip.Addr) (unfence func(), ok bool)
}

// HostView is the node's pod networking as leak detection checks it
// (ipamd.Host provides it).
type HostView interface {
	// PodRoutes lists host routes to pod veths; an error means no view.
	PodRoutes() ([]hostnet.PodRoute, error)
	// RemovePodRules deletes the per-pod policy rules of an address.
	RemovePodRules(addr netip.Addr) (int, error)
}

// Adapter implements Daemon over a Source and a HostView; subnet free
// counts come from Subnets (fleetmetrics.Subnets.Latest: the daemon's one
// cached DescribeSubnets, so publishing costs no EC2 call).
type Adapter struct {
	Source  Source
	Host    HostView
	Subnets func() ([]provider.Subnet, time.Time) // nil: no subnets published
}

var _ Daemon = (*Adapter)(nil)

// Snapshot reads the daemon's introspection state.
func (a *Adapter) Snapshot() Snapshot {
	st := a.Source.State()
	s := Snapshot{
		Ready: st.Ready, InstanceID: st.Node.InstanceID, InstanceType: st.Node.InstanceType, Zone: st.Node.AvailabilityZone,
		PrefixMode: st.Node.Mode == introspect.ModePrefix,
		Assigned:   st.Pool.Assigned, Warm: st.Pool.Warm, Cooling: st.Pool.Cooling, Capacity: st.Pool.Capacity, Budget: st.Pool.Budget,
		ENIs: st.Pool.ENIs, MaxENIs: st.Pool.MaxENIs, Version: st.Node.Version, CheckpointSchema: checkpoint.Version,
		SandboxNetns: st.SandboxNetns,
	}
	for _, as := range st.Assignments {
		s.Assignments = append(s.Assignments, Assignment{Key: as.Key, Pod: as.Pod, AssignedAt: as.AssignedAt})
	}
	if p := st.Placement; p != nil {
		s.PodSubnet = &addressbudget.PodSubnet{Mode: p.Mode, Subnet: p.SubnetID, SecurityGroups: p.SecurityGroups,
			ENIConfig: p.ENIConfig, Reason: p.Reason, Problem: p.Problem, Cause: p.Cause}
	}
	if a.Subnets != nil {
		latest, _ := a.Subnets()
		for _, sn := range latest {
			s.Subnets = append(s.Subnets, addressbudget.Subnet{ID: sn.ID, CIDR: sn.CIDR.String(), Free: sn.FreeAddresses})
		}
		sort.Slice(s.Subnets, func(i, j int) bool { return s.Subnets[i].ID < s.Subnets[j].ID })
	}
	return s
}

// ReleaseLeaked releases as after the host checks the daemon's own route
// check uses: no host route leads to the address (the pod's veth and netns
// are gone with it). Its pod rules are removed first; without a host view,
// or when they cannot be removed, nothing is released.
func (a *Adapter) ReleaseLeaked(as Assignment) (bool, string) {
	addr, ok := a.addressOf(as.Key)
	if !ok {
		return false, "no longer held"
	}
	routes, err := a.Host.PodRoutes()
	if err != nil {
		return false, "host pod routes not readable: " + err.Error()
	}
	for _, r := range routes {
		if r.Address == addr {
			return false, fmt.Sprintf("host still routes %s to %s", addr, r.HostVeth)
		}
	}
	// No DEL ran: the plugin's policy rules for the address are still
	// there. They go while the address is held and fenced, so no ADD can
	// have been given it and they cannot be a new pod's (B13), also when a
	// late DEL releases it meanwhile with IP_COOLDOWN_PERIOD=0; if they
	// stay, so does the assignment.
	unfence, ok := a.Source.FenceHeld(as.Key, addr)
	if !ok {
		return false, "no longer held"
	}
	defer unfence()
	if _, err := a.Host.RemovePodRules(addr); err != nil {
		return false, "pod rules not removed, not released: " + err.Error()
	}
	resp, err := a.Source.Release(api.ReleaseRequest{Version: api.Version, Key: as.Key})
	if err != nil || !resp.Released {
		return false, "release refused: " + errText(err)
	}
	return true, ""
}

func (a *Adapter) addressOf(k api.Key) (netip.Addr, bool) {
	for _, as := range a.Source.State().Assignments {
		if as.Key == k {
			return as.Address, true
		}
	}
	return netip.Addr{}, false
}

func errText(err error) string {
	if err == nil {
		return "not held"
	}
	return err.Error()
}

// PodsHolding asks the daemon which pods hold an address.
func (a *Adapter) PodsHolding() map[string]bool { return a.Source.PodsHolding() }
