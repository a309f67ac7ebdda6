package datastore

import (
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// HostRoute is one pod route the node shows: the address, the host veth it
// leads to, and the attachment that veth records (the plugin's sandbox
// alias); Sandbox is the zero Key when the veth records none.
type HostRoute struct {
	Address  netip.Addr
	HostVeth string
	Sandbox  api.Key
}

// Conflict is an address the datastore recorded for one attachment while the
// host routes it to another sandbox's veth (a checkpoint older than the host:
// written by a build that served for a while after it, or restored from an
// old copy). The host's truth wins.
type Conflict struct {
	Address  netip.Addr
	Recorded api.Key // who the datastore said held it
	HostVeth string  // where the host routes it
	Sandbox  api.Key // the sandbox that veth records; zero when it records none
	// Now is who holds it after the repair: Sandbox, or a placeholder
	// (Owner.Recovered) when the sandbox is unknown or already holds another
	// address. Either way the address is never handed out while routed.
	Now api.Key
}

// HostReport is what FromHost changed.
type HostReport struct {
	// Recovered: free addresses the host routes to a pod, now held: under the
	// sandbox's own key when its veth records it, else under a placeholder.
	Recovered []Assignment
	// Conflicts: held addresses the host routes to another sandbox.
	Conflicts []Conflict
	// Identified: placeholders whose veth now records its sandbox, moved to
	// that sandbox's key.
	Identified []Assignment
}

// FromHost makes the datastore agree with the host's pod routes, the
// ground truth of which sandbox uses which address (a packet to the address
// reaches that veth). For every route to an address on our ENIs:
//   - free: held for the route's sandbox (or a placeholder), so it is never
//     handed to a second pod;
//   - held by the sandbox the veth records, or by a placeholder on that veth:
//     consistent (a placeholder is moved to the recorded sandbox's key);
//   - held by another key while the veth records a different sandbox, or
//     (veth records nothing) while the holder was recorded on another veth:
//     a conflict, repaired to the host's view and reported.
//
// Addresses without a route are left to the caller's route-less release.
func (r Recovery) FromHost(routes []HostRoute, now time.Time) HostReport {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var rep HostReport
	for _, r := range routes {
		a := s.addrs[r.Address]
		if a == nil {
			// In a lazy slot (an IPv6 /80) the store knows only what it
			// handed out; a routed address it does not know (a lost
			// checkpoint) is made known so it is held, never handed out.
			a = s.knowLazyLocked(r.Address)
		}
		if a == nil || a.eni == "" {
			continue
		}
		switch {
		case a.owner == nil:
			a.owner = s.hostOwnerLocked(r, now)
			a.releasing = false
			s.byKey[a.owner.Key] = r.Address
			rep.Recovered = append(rep.Recovered, s.assignmentLocked(r.Address, a))
		case r.Sandbox == a.owner.Key:
		case a.owner.Recovered && a.owner.HostVeth == r.HostVeth:
			if r.Sandbox.ContainerID == "" || s.holdsLocked(r.Sandbox) {
				continue
			}
			s.rekeyLocked(r.Address, a, &Owner{Key: r.Sandbox, AssignedAt: a.owner.AssignedAt, HostVeth: r.HostVeth})
			rep.Identified = append(rep.Identified, s.assignmentLocked(r.Address, a))
		case r.Sandbox.ContainerID != "" || (a.owner.HostVeth != "" && a.owner.HostVeth != r.HostVeth):
			c := Conflict{Address: r.Address, Recorded: a.owner.Key, HostVeth: r.HostVeth, Sandbox: r.Sandbox}
			delete(s.byKey, a.owner.Key)
			a.owner = nil
			s.rekeyLocked(r.Address, a, s.hostOwnerLocked(r, now))
			c.Now = a.owner.Key
			rep.Conflicts = append(rep.Conflicts, c)
		}
	}
	if len(rep.Recovered)+len(rep.Conflicts)+len(rep.Identified) > 0 {
		s.gen++
	}
	sortAssignments(rep.Recovered)
	sortAssignments(rep.Identified)
	return rep
}

// hostOwnerLocked is the owner a routed address gets from the host: the
// sandbox its veth records, unless that key already holds another address
// (one address per key), else a placeholder naming the veth.
func (s *state) hostOwnerLocked(r HostRoute, now time.Time) *Owner {
	if r.Sandbox.ContainerID != "" && !s.holdsLocked(r.Sandbox) {
		return &Owner{Key: r.Sandbox, AssignedAt: now, HostVeth: r.HostVeth}
	}
	return &Owner{Key: api.Key{ContainerID: "recovered:" + r.Address.String()}, AssignedAt: now, Recovered: true, HostVeth: r.HostVeth}
}

func (s *state) holdsLocked(k api.Key) bool {
	_, ok := s.byKey[k]
	return ok
}

// rekeyLocked gives addr (state a) to owner o, dropping its previous key.
func (s *state) rekeyLocked(addr netip.Addr, a *address, o *Owner) {
	if a.owner != nil {
		delete(s.byKey, a.owner.Key)
	}
	a.owner = o
	s.byKey[o.Key] = addr
}

// knowLazyLocked makes addr known, free, on the ENI whose lazy slot holds
// it, and returns it; nil when no lazy slot of a known ENI holds addr.
func (s *state) knowLazyLocked(addr netip.Addr) *address {
	for _, e := range s.enis {
		for _, slot := range e.Slots {
			if lazy(slot) && slot.Contains(addr) {
				a := &address{eni: e.ID, slot: slot}
				s.unflushedLocked(a)
				s.addrs[addr] = a
				return a
			}
		}
	}
	return nil
}
