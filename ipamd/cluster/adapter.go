package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
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
}

// HostView is the node's pod networking as leak detection checks it
// (ipamd.Host provides it).
type HostView interface {
	// PodRoutes lists host routes to pod veths; an error means no view.
	PodRoutes() ([]hostnet.PodRoute, error)
	// RemovePodRules deletes the per-pod policy rules of an address.
	RemovePodRules(addr netip.Addr) (int, error)
}

// SubnetsTTL is how long DescribeSubnets figures are reused: one EC2 call
// per node per 5 minutes at most.
const SubnetsTTL = 5 * time.Minute

// Adapter implements Daemon over a Source, a HostView and the provider's
// DescribeSubnets (cached for SubnetsTTL).
type Adapter struct {
	Source   Source
	Host     HostView
	Provider provider.Provider // for subnet free counts; nil: none published
	Now      func() time.Time  // nil: time.Now

	mu        sync.Mutex // guards the subnet cache
	subnets   map[string]addressbudget.Subnet
	fetchedAt time.Time
	fetching  bool
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
	}
	for _, as := range st.Assignments {
		s.Assignments = append(s.Assignments, Assignment{Key: as.Key, Pod: as.Pod, AssignedAt: as.AssignedAt})
	}
	ids := map[string]bool{}
	for _, e := range st.ENIs {
		ids[e.SubnetID] = true
	}
	s.Subnets = a.subnetsOf(ids)
	return s
}

// subnetsOf returns the cached subnets, refreshing them in the background
// when stale or when the node's set of subnets changed; never blocks.
func (a *Adapter) subnetsOf(ids map[string]bool) []addressbudget.Subnet {
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	same := len(ids) == len(a.subnets)
	for id := range ids {
		if _, ok := a.subnets[id]; !ok {
			same = false
		}
	}
	if a.Provider != nil && !a.fetching && len(ids) > 0 && (!same || now().Sub(a.fetchedAt) >= SubnetsTTL) {
		a.fetching = true
		go a.fetch(ids, now)
	}
	var out []addressbudget.Subnet // a subnet not fetched yet is published once known
	for id := range ids {
		if sn, ok := a.subnets[id]; ok {
			out = append(out, sn)
		}
	}
	sortSubnets(out)
	return out
}

func (a *Adapter) fetch(ids map[string]bool, now func() time.Time) {
	q := provider.SubnetQuery{}
	for id := range ids {
		q.IDs = append(q.IDs, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := a.Provider.Subnets(ctx, q)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fetching = false
	a.fetchedAt = now() // also on error: retried after the TTL
	if err != nil {
		return
	}
	a.subnets = map[string]addressbudget.Subnet{}
	for _, sn := range got {
		a.subnets[sn.ID] = addressbudget.Subnet{ID: sn.ID, CIDR: sn.CIDR.String(), Free: sn.FreeAddresses}
	}
}

func sortSubnets(s []addressbudget.Subnet) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].ID < s[j-1].ID; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// ReleaseLeaked releases as after the host checks the daemon's own route
// check uses: no host route leads to the address (the pod's veth and netns
// are gone with it). Without a host view nothing is released.
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
	resp, err := a.Source.Release(api.ReleaseRequest{Version: api.Version, Key: as.Key})
	if err != nil || !resp.Released {
		return false, "release refused: " + errText(err)
	}
	// No DEL ran: the plugin's policy rules for the address are still there.
	if _, err := a.Host.RemovePodRules(addr); err != nil {
		return true, "released; pod rules not removed: " + err.Error()
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
