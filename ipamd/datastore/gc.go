package datastore

import (
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// Collector lists and releases the assignments whose attachments the
// container runtime no longer lists (CNI spec 1.1 GC, whose request names
// the valid attachments). Get it from Store.Collector; it works under the
// store's lock.
type Collector struct{ s *state }

// GC releases, at now, every assignment of network whose key is not in valid
// and that is at least grace old (so an ADD racing the runtime's listing is
// spared). Recovered assignments have no network and are left to the host
// route check. It returns what it released.
func (c Collector) GC(network string, valid map[api.Key]bool, grace time.Duration, now time.Time) []Assignment {
	return c.gc(network, valid, grace, now, nil, true)
}

// Stale returns what GC would release at now, releasing nothing.
func (c Collector) Stale(network string, valid map[api.Key]bool, grace time.Duration, now time.Time) []Assignment {
	return c.gc(network, valid, grace, now, nil, false)
}

// GCOnly is GC limited to the keys of only, each while it still holds the
// address only gives it (what a Stale listed and whose host state the
// plugin has removed since): a key now holding another address, or no
// longer stale, is left alone.
func (c Collector) GCOnly(network string, valid map[api.Key]bool, grace time.Duration, now time.Time, only map[api.Key]netip.Addr) []Assignment {
	if only == nil {
		only = map[api.Key]netip.Addr{}
	}
	return c.gc(network, valid, grace, now, only, true)
}

// gc lists (release false) or releases the stale assignments of network,
// among only's when only is not nil.
func (c Collector) gc(network string, valid map[api.Key]bool, grace time.Duration, now time.Time, only map[api.Key]netip.Addr, release bool) []Assignment {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Assignment
	for key, addr := range s.byKey {
		o := s.addrs[addr].owner
		if key.Network != network || valid[key] || o.Recovered || now.Sub(o.AssignedAt) < grace {
			continue
		}
		if want, listed := only[key]; only != nil && (!listed || want != addr) {
			continue
		}
		if !release {
			out = append(out, s.assignmentLocked(addr, s.addrs[addr]))
			continue
		}
		a, _ := s.releaseLocked(key, now)
		out = append(out, a)
	}
	sortAssignments(out)
	return out
}
