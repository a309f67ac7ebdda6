package datastore

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
)

// Recovery persists the store (Checkpoint, Restore) and rebuilds what a
// lost checkpoint took from the host's pod routes (CoolFree, Recover,
// FromHost). Get it from Store.Recovery; it works under the store's lock.
type Recovery struct{ s *state }

// Checkpoint returns the state to persist at now, and the generation it
// reflects: every assignment, every free address still cooling down, and
// every address that left the node unflushed.
func (r Recovery) Checkpoint(now time.Time) (checkpoint.State, uint64) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	st := checkpoint.State{Version: checkpoint.Version, Written: now, Generation: s.gen, Assignments: []checkpoint.Assignment{}}
	for addr, a := range s.addrs {
		switch {
		case a.owner != nil:
			st.Assignments = append(st.Assignments, checkpoint.Assignment{
				Key: a.owner.Key, Pod: a.owner.Pod, Address: addr, ENI: a.eni,
				AssignedAt: a.owner.AssignedAt, Recovered: a.owner.Recovered, HostVeth: a.owner.HostVeth, Netns: a.owner.Netns,
			})
		case s.coolingLocked(a, now):
			st.Cooling = append(st.Cooling, checkpoint.Cooling{Address: addr, ENI: a.eni, UnassignedAt: a.unassignedAt})
		}
	}
	for addr := range s.gone {
		st.Departed = append(st.Departed, addr)
	}
	slices.SortFunc(st.Departed, netip.Addr.Compare)
	slices.SortFunc(st.Assignments, func(x, y checkpoint.Assignment) int { return x.Address.Compare(y.Address) })
	slices.SortFunc(st.Cooling, func(x, y checkpoint.Cooling) int { return x.Address.Compare(y.Address) })
	return st, s.gen
}

// Restore loads a checkpoint into an empty store. Addresses are not on any ENI
// until the first Sync places them; until then nothing can be assigned.
func (r Recovery) Restore(st checkpoint.State) error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.addrs) != 0 {
		return fmt.Errorf("restore into a store holding %d addresses", len(s.addrs))
	}
	for _, a := range st.Assignments {
		o := &Owner{Key: a.Key, Pod: a.Pod, AssignedAt: a.AssignedAt, Recovered: a.Recovered, HostVeth: a.HostVeth, Netns: a.Netns}
		s.addrs[a.Address] = &address{owner: o}
		s.byKey[a.Key] = a.Address
	}
	for _, c := range st.Cooling {
		if s.addrs[c.Address] == nil {
			s.addrs[c.Address] = &address{unassignedAt: c.UnassignedAt}
			s.unflushedLocked(s.addrs[c.Address])
		}
	}
	for _, d := range st.Departed {
		if s.addrs[d] == nil && s.flushing {
			s.flushMark++
			s.gone[d] = s.flushMark
		}
	}
	s.gen = max(s.gen, st.Generation) + 1 // generations keep rising across restarts
	return nil
}

// Reset forgets everything: ENIs, addresses, assignments and cooldowns.
func (r Recovery) Reset() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.enis)
	clear(s.addrs)
	clear(s.byKey)
	s.synced = false
	s.gen++
	s.notifyLocked()
}

// CoolFree starts the cooldown at now for every free address. The daemon uses
// it when the checkpoint was lost: release times are unknown, so every free
// address is treated as just released.
func (r Recovery) CoolFree(now time.Time) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.addrs {
		if a.owner == nil {
			a.unassignedAt = now
		}
	}
	s.gen++
}

// Recover gives every free address on our ENIs that the host routes to a pod
// (addr → host veth) a recovered owner, so it is not handed out twice after
// the checkpoint was lost or missed it. It returns the new assignments.
func (r Recovery) Recover(routes map[netip.Addr]string, now time.Time) []Assignment {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Assignment
	for addr, veth := range routes {
		a := s.addrs[addr]
		if a == nil || a.owner != nil || a.eni == "" {
			continue
		}
		key := api.Key{ContainerID: "recovered:" + addr.String()}
		a.owner = &Owner{Key: key, AssignedAt: now, Recovered: true, HostVeth: veth}
		a.releasing = false
		s.byKey[key] = addr
		out = append(out, s.assignmentLocked(addr, a))
	}
	if len(out) > 0 {
		s.gen++
	}
	sortAssignments(out)
	return out
}

func sortAssignments(as []Assignment) {
	slices.SortFunc(as, func(x, y Assignment) int {
		return cmp.Or(x.Address.Compare(y.Address), cmp.Compare(x.Key.String(), y.Key.String()))
	})
}
