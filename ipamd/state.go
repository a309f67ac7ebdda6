package ipamd

import (
	"net/netip"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/routing"
)

// State is the daemon's introspection view: node, pool numbers, ENIs with
// their addresses, assignments with pod names, cooling addresses, effective
// configuration and readiness.
func (d *Daemon) State() introspect.State {
	now := d.now()
	st := d.Status()
	enis := d.store.ENIs()
	assigned := d.store.Assignments()
	cp, _ := d.store.Checkpoint(now)
	d.mu.Lock()
	self, lim := d.self, d.limits
	links := make(map[string]string, len(d.links))
	for k, v := range d.links {
		links[k] = v
	}
	d.mu.Unlock()

	mode := introspect.ModeSecondaryIP
	if d.slotSize(lim) > 1 {
		mode = introspect.ModePrefix
	}
	out := introspect.State{
		Node: introspect.NodeInfo{Name: d.cfg.NodeName, InstanceID: self.ID, InstanceType: self.Type,
			AvailabilityZone: self.AvailabilityZone, PrimaryIP: self.PrimaryIP, Mode: mode, Version: d.version, StartedAt: d.started},
		Pool: introspect.Pool{Assigned: st.Assigned, Warm: st.Warm, Cooling: st.Cooling, Capacity: st.Capacity,
			Budget: st.Budget, ENIs: st.ENIs, MaxENIs: st.MaxENIs},
		ENIs:        []introspect.ENI{},
		Assignments: []introspect.Assignment{},
		Cooling:     []introspect.CoolingAddress{},
		Config:      d.cfg.Map(),
		Ready:       st.Ready,
		Reason:      st.Reason,
		Time:        now,
	}
	for _, e := range enis {
		ie := introspect.ENI{ID: e.ID, MAC: e.MAC, DeviceNumber: e.DeviceNumber, RouteTable: routing.TableForDevice(e.DeviceNumber),
			LinkName: links[e.ID], SubnetID: e.SubnetID, SubnetCIDR: e.SubnetCIDR, PrimaryIP: e.PrimaryIP,
			Addresses: []netip.Addr{}, Capacity: eniCapacity(e, lim, d.slotSize(lim))}
		for _, s := range e.Slots {
			if s.Bits() < s.Addr().BitLen() {
				ie.Prefixes = append(ie.Prefixes, s)
			}
			for a := s.Addr(); s.Contains(a); a = a.Next() {
				ie.Addresses = append(ie.Addresses, a)
			}
		}
		out.ENIs = append(out.ENIs, ie)
	}
	for _, a := range assigned {
		out.Assignments = append(out.Assignments, introspect.Assignment{Key: a.Key, Pod: a.Pod, Address: a.Address,
			ENIID: a.ENIID, AssignedAt: a.AssignedAt})
	}
	for _, c := range cp.Cooling {
		out.Cooling = append(out.Cooling, introspect.CoolingAddress{Address: c.Address, ENIID: c.ENI, UnassignedAt: c.UnassignedAt})
	}
	return out
}
