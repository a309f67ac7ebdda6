package datastore

import (
	"net/netip"
	"slices"

	"github.com/vpcip/vpcip/ipamd/api"
)

// Fences keeps addresses back from Assign while their host state is
// removed (rule removal before release, B13). Get it from Store.Fences; it
// works under the store's lock.
type Fences struct{ s *state }

// Fencer names who fenced an address (Fence, FenceHeld): each removes its
// own fence, so one caller's Unfence never lifts another's.
type Fencer string

// Fence keeps free addr from being handed out until by Unfences it, while
// by removes host state left for it (a vanished pod's policy rules): an ADD
// given it meanwhile would have its new rules removed (B13). It reports
// false, fencing nothing, when addr is unknown or held. Fencing twice by
// the same Fencer is one fence.
func (f Fences) Fence(addr netip.Addr, by Fencer) bool {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.addrs[addr]
	if a == nil || a.owner != nil {
		return false
	}
	a.fence(by)
	return true
}

// FenceHeld is Fence for an address key holds, while by removes its host
// state before releasing it: a release meanwhile (a late DEL of the key, a
// GC) frees the address but does not lift the fence, so with
// IP_COOLDOWN_PERIOD=0 no ADD is given it until by's removal is done and
// it Unfences. It reports false, fencing nothing, when key does not hold
// addr.
func (f Fences) FenceHeld(key api.Key, addr netip.Addr, by Fencer) bool {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if held, ok := s.byKey[key]; !ok || held != addr {
		return false
	}
	s.addrs[addr].fence(by)
	return true
}

func (a *address) fence(by Fencer) {
	if !slices.Contains(a.fences, by) {
		a.fences = append(a.fences, by)
	}
}

// FencedBy lists the addresses by fences, in no order.
func (f Fences) FencedBy(by Fencer) []netip.Addr {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []netip.Addr
	for addr, a := range s.addrs {
		if slices.Contains(a.fences, by) {
			out = append(out, addr)
		}
	}
	return out
}

// Unfence lifts by's fence of addr; Assign hands it out again once no
// fence is left.
func (f Fences) Unfence(addr netip.Addr, by Fencer) {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.addrs[addr]
	if a == nil {
		return
	}
	if i := slices.Index(a.fences, by); i >= 0 {
		a.fences = slices.Delete(a.fences, i, i+1)
		if len(a.fences) == 0 {
			a.fences = nil
			s.notifyLocked()
		}
	}
}
