// Package datastore is vpcipd's in-memory view of the node's addresses: the
// attached ENIs, their secondary addresses and /28 prefixes (slots), and which
// attachment key (CNI network, container ID, ifname) holds each address, with
// the pod's metadata, when it was assigned and when it was last released.
//
// Rules it enforces under one mutex:
//   - one owner per address and one address per key (ADD with a held key
//     returns the same address);
//   - release is by key only; an unknown key releases nothing;
//   - a released address is not handed out again before the cooldown
//     (IP_COOLDOWN_PERIOD) has passed since its release;
//   - a slot chosen for release or an ENI chosen for deletion is marked under
//     the same lock the allocator uses, so it can never be handed out while the
//     cloud call is in flight, and a slot or ENI holding an assigned address is
//     never marked;
//   - an assigned address is never forgotten, whatever the cloud says.
//
// Times are passed in (now), so the package reads no clock.
package datastore

import (
	"errors"
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// CohortWindow is how close in time assignments must be to count as one
// cohort: pods that arrive together (a job's burst, a rollout's waves)
// tend to leave together, so Assign puts the next pod in the slot holding
// the latest assignment within it, and the cohort's /28s empty together
// and can be released whole. Measured in the pool simulator (`make
// bench-pool`, seeds 1–5, prefix mode): 1.5 % fewer idle address-hours
// than packing by the busiest slot alone, a trade between traces (README,
// "Which /28 a pod gets").
const CohortWindow = 5 * time.Minute

// ErrNoAddress: no address is free to assign now. Counts tells why.
var ErrNoAddress = errors.New("no free address")

// ErrMaxAssigned: the node holds as many assignments as its pod limit allows
// (SetMaxAssigned), free addresses or not.
var ErrMaxAssigned = errors.New("node at its pod limit")

// ENI is an attached ENI as the datastore knows it.
type ENI struct {
	ID           string
	MAC          string
	DeviceNumber int // 0: the instance's primary ENI
	SubnetID     string
	SubnetCIDR   netip.Prefix
	Gateway      netip.Addr
	PrimaryIP    netip.Addr // the ENI's own address, never a pod's
	Attached     time.Time
	Slots        []netip.Prefix // secondary /32s and /28 prefixes, or IPv6 /80 prefixes (lazy: LazySlotBits), sorted
	Deleting     bool           // chosen for deletion: nothing on it is handed out
}

// Primary reports whether this is the instance's primary ENI.
func (e ENI) Primary() bool { return e.DeviceNumber == 0 }

// Owner is who holds an address.
type Owner struct {
	Key        api.Key
	Pod        api.Pod
	AssignedAt time.Time
	// Recovered: rebuilt from a host pod route when the checkpoint was lost;
	// Key is synthetic and HostVeth names the pod's host interface.
	Recovered bool
	HostVeth  string
	// Netns is the sandbox's netns path (CNI_NETNS) as ADD gave it; "" when
	// unknown. Its absence is evidence the sandbox is gone.
	Netns string
}

// Assignment is an address held by an owner, with its ENI's facts.
type Assignment struct {
	Owner
	Address      netip.Addr
	ENIID        string // "" when the cloud no longer shows the address on any ENI
	DeviceNumber int
	SubnetCIDR   netip.Prefix
	// Unflushed (from Assign only): the address may still have conntrack
	// entries of a previous holder, not flushed since; the caller flushes
	// them (FlushMark: the mark to give Flushed) before the pod uses it.
	Unflushed bool
	FlushMark uint64
}

// address is one pod-usable address.
type address struct {
	eni          string       // "" while not on any known ENI (restored, or gone from the cloud)
	slot         netip.Prefix // the /32 or /28 it belongs to
	owner        *Owner
	unassignedAt time.Time // last release; zero: never released
	releasing    bool      // its slot is being unassigned: never hand it out
	fences       []Fencer  // who is removing its host state (Fence, FenceHeld): never hand it out while any is
	unflushed    uint64    // conntrack not flushed since it was marked (the mark); 0: clean
}

// state is the store's data, guarded by its one mutex. Store and the
// parts it hands out (Cloud, Fences, Collector, Conntrack, Recovery) each
// work on it under that mutex; its methods named *Locked need it held.
type state struct {
	cooldown time.Duration

	mu          sync.Mutex                  // guards the fields below
	maxAssigned int                         // 0: no limit (VPCIP_MAX_PODS)
	enis        map[string]*ENI             // by ENI id
	addrs       map[netip.Addr]*address     // every address we know, assigned or not
	byKey       map[api.Key]netip.Addr      // assigned addresses by key
	gen         uint64                      // bumped on every change a checkpoint records
	synced      bool                        // a Sync with the authoritative ENI list happened
	changed     chan struct{}               // closed (and replaced) when an address may have become free
	flushing    bool                        // conntrack flush bookkeeping on (Conntrack.SetFlushing)
	flushMark   uint64                      // last mark given to an unflushed address
	gone        map[netip.Addr]uint64       // addresses that left the node unflushed, by their mark (see forgetLocked)
	next        map[netip.Prefix]netip.Addr // per lazy slot, where freshLocked looks first
}

// Store is the datastore: the assignment of addresses to attachment keys
// (Assign, Release, Get, ...), and the pool's counts. The other lifecycles
// of an address are parts of their own, over the same state and lock:
//   - Cloud: ENIs and slots as EC2 shows them, and their release;
//   - Fences: addresses kept back while their host state is removed;
//   - Collector: CNI GC of attachments the runtime no longer lists;
//   - Conntrack: which addresses need a conntrack flush;
//   - Recovery: the checkpoint, and the host's pod routes after a loss.
//
// The zero value is not usable; use New.
type Store struct {
	s *state
}

// New returns an empty store whose released addresses cool down for cooldown.
func New(cooldown time.Duration) *Store {
	return &Store{s: &state{
		cooldown: cooldown,
		enis:     map[string]*ENI{},
		addrs:    map[netip.Addr]*address{},
		byKey:    map[api.Key]netip.Addr{},
		gone:     map[netip.Addr]uint64{},
		next:     map[netip.Prefix]netip.Addr{},
		changed:  make(chan struct{}),
	}}
}

// Cloud is the part that keeps the store's ENIs and slots equal to EC2's
// and marks them for release.
func (d *Store) Cloud() Cloud { return Cloud{d.s} }

// Fences is the part that keeps addresses back while their host state is
// removed.
func (d *Store) Fences() Fences { return Fences{d.s} }

// Collector is the part that releases assignments whose attachments the
// container runtime no longer lists (CNI GC).
func (d *Store) Collector() Collector { return Collector{d.s} }

// Conntrack is the part that tracks which addresses need a conntrack flush.
func (d *Store) Conntrack() Conntrack { return Conntrack{d.s} }

// Recovery is the part that persists the store and rebuilds it from the
// checkpoint and the host's pod routes.
func (d *Store) Recovery() Recovery { return Recovery{d.s} }

// SetMaxAssigned caps the assignments the store hands out, in pods (0: no
// cap). Set it before use; the cap holds even when free addresses remain
// (warm addresses rounded up to a /28, or a limit lowered across a restart).
func (d *Store) SetMaxAssigned(n int) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxAssigned = max(n, 0)
}

// Changed returns a channel closed at the next change that may free or add an
// address (a release, new slots, a cancelled release). ADDs waiting for the
// pool select on it.
func (d *Store) Changed() <-chan struct{} {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *state) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Generation counts checkpointed changes; equal generations mean equal state.
func (d *Store) Generation() uint64 {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// coolingLocked reports whether a is free but released less than cooldown ago.
func (s *state) coolingLocked(a *address, now time.Time) bool {
	return a.owner == nil && !a.unassignedAt.IsZero() && now.Sub(a.unassignedAt) < s.cooldown
}

func (s *state) assignmentLocked(addr netip.Addr, a *address) Assignment {
	out := Assignment{Owner: *a.owner, Address: addr, ENIID: a.eni}
	if e := s.enis[a.eni]; e != nil {
		out.DeviceNumber = e.DeviceNumber
		out.SubnetCIDR = e.SubnetCIDR
	}
	return out
}

// Assign gives key an address. A key that already holds one gets it again
// (existing true). Otherwise it picks a free address out of cooldown: on the
// primary ENI first (it is never freed), then on the ENI holding the most
// assignments, so the other ENIs stay empty and can be released; within an
// ENI, from the slot holding the latest assignment made within
// CohortWindow, then from the slot holding the most, so whole /28s stay
// releasable, and among slots holding as many, from a /28 before a single
// address. It returns ErrNoAddress when nothing is free, ErrMaxAssigned at
// the pod limit.
func (d *Store) Assign(key api.Key, pod api.Pod, now time.Time) (a Assignment, existing bool, err error) {
	return d.AssignIn(key, pod, "", now)
}

// AssignIn is Assign recording the sandbox's netns path too.
func (d *Store) AssignIn(key api.Key, pod api.Pod, netns string, now time.Time) (a Assignment, existing bool, err error) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if addr, ok := s.byKey[key]; ok {
		return s.assignmentLocked(addr, s.addrs[addr]), true, nil
	}
	if s.maxAssigned > 0 && len(s.byKey) >= s.maxAssigned {
		return Assignment{}, false, ErrMaxAssigned
	}
	addr, ok := s.pickLocked(now)
	if !ok {
		addr, ok = s.freshLocked()
	}
	if !ok {
		return Assignment{}, false, ErrNoAddress
	}
	st := s.addrs[addr]
	st.owner = &Owner{Key: key, Pod: pod, AssignedAt: now, Netns: netns}
	s.byKey[key] = addr
	s.gen++
	out := s.assignmentLocked(addr, st)
	if st.unflushed != 0 {
		out.Unflushed, out.FlushMark = true, s.flushMark
	}
	return out, false, nil
}

// Unassign undoes an Assign that could not be made durable. It is Release
// without a cooldown: the address never reached a pod.
func (d *Store) Unassign(key api.Key) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	addr, ok := s.byKey[key]
	if !ok {
		return
	}
	delete(s.byKey, key)
	s.addrs[addr].owner = nil
	s.gen++
	s.notifyLocked()
}

// pickLocked chooses the address Assign hands out (see Assign).
func (s *state) pickLocked(now time.Time) (netip.Addr, bool) {
	used := map[string]int{}
	slotUsed := map[netip.Prefix]int{}
	latest := map[netip.Prefix]time.Time{} // a /28's latest assignment within CohortWindow
	for _, a := range s.addrs {
		if a.owner != nil {
			used[a.eni]++
			slotUsed[a.slot]++
			// Only a slot of several addresses can be a cohort's: a single
			// address held is never free. A clock stepped back leaves
			// assignments after now: no cohort, so such a slot is not
			// preferred for minutes.
			if at := a.owner.AssignedAt; a.slot.Bits() < a.slot.Addr().BitLen() && !at.After(now) && now.Sub(at) <= CohortWindow && at.After(latest[a.slot]) {
				latest[a.slot] = at
			}
		}
	}
	var best netip.Addr
	var bestRank [6]int
	for addr, a := range s.addrs {
		if a.owner != nil || a.releasing || len(a.fences) > 0 || a.eni == "" || s.coolingLocked(a, now) {
			continue
		}
		if lazy(a.slot) {
			// A freed address of a /80 is not handed out again (see
			// freshLocked): once its cooldown is over the store forgets it.
			s.forgetLocked(addr, a)
			continue
		}
		e := s.enis[a.eni]
		if e == nil || e.Deleting {
			continue
		}
		primary := 1
		if e.Primary() {
			primary = 0
		}
		// Lower rank wins: primary ENI, busiest ENI, lowest device, the
		// slot of the latest cohort, busiest slot, then a /28 before a
		// single address (in prefix mode, those left from the no-/28
		// fallback then stay free to be released).
		cohort := math.MaxInt // no assignment within CohortWindow
		if at, ok := latest[a.slot]; ok {
			cohort = int(now.Sub(at) / time.Millisecond)
		}
		rank := [6]int{primary, -used[a.eni], e.DeviceNumber, cohort, -slotUsed[a.slot], a.slot.Bits()}
		if !best.IsValid() || less(rank, bestRank) || (rank == bestRank && addr.Less(best)) {
			best, bestRank = addr, rank
		}
	}
	return best, best.IsValid()
}

// freshLocked makes and returns an address of a lazy slot (an IPv6 /80) the
// store has not handed out, in the first lazy slot of the primary ENI (then
// the other ENIs by device number). Addresses go up from the prefix's
// first (left unused, as a subnet's router anycast address is) and are not
// reused: a /80 has 2^48 of them, so a released address is forgotten once
// its cooldown is over (pickLocked) and the next pod gets the next address.
// Conntrack entries of an earlier pod (kept for days for an established
// connection) thus never meet a new one, for IPv6 as the flush does for
// IPv4 (hostnet.FlushConntrack flushes IPv4 only). After a restart the
// search starts above the highest address the checkpoint or the host's
// routes name. A fresh address needs no conntrack flush unless it left the
// store unflushed before (gone).
func (s *state) freshLocked() (netip.Addr, bool) {
	for _, e := range s.enisLocked() {
		if e.Deleting {
			continue
		}
		for _, slot := range e.Slots {
			if !lazy(slot) {
				continue
			}
			addr := s.next[slot]
			if !slot.Contains(addr) {
				addr = slot.Masked().Addr().Next()
				if known := s.knownInLocked(slot); len(known) > 0 {
					addr = known[len(known)-1].Next()
				}
			}
			for ; slot.Contains(addr); addr = addr.Next() {
				if s.addrs[addr] != nil {
					continue
				}
				a := &address{eni: e.ID, slot: slot}
				if mark, ok := s.gone[addr]; ok {
					a.unflushed = mark
					delete(s.gone, addr)
				}
				s.addrs[addr] = a
				s.next[slot] = addr.Next()
				return addr, true
			}
			delete(s.next, slot) // the top reached: look again from the bottom next time
		}
	}
	return netip.Addr{}, false
}

func less(a, b [6]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// Release frees key's address; it starts cooling down at now. An unknown key
// releases nothing (ok false).
func (d *Store) Release(key api.Key, now time.Time) (Assignment, bool) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseLocked(key, now)
}

// ReleaseHeld is Release when key holds addr, else it releases nothing (ok
// false): the caller removed addr's host state while key held it.
func (d *Store) ReleaseHeld(key api.Key, addr netip.Addr, now time.Time) (Assignment, bool) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey[key] != addr {
		return Assignment{}, false
	}
	return s.releaseLocked(key, now)
}

func (s *state) releaseLocked(key api.Key, now time.Time) (Assignment, bool) {
	addr, ok := s.byKey[key]
	if !ok {
		return Assignment{}, false
	}
	st := s.addrs[addr]
	out := s.assignmentLocked(addr, st)
	delete(s.byKey, key)
	st.owner = nil
	st.unassignedAt = now
	s.unflushedLocked(st)
	if st.eni == "" && s.synced {
		delete(s.addrs, addr) // the cloud no longer has it: nothing to cool
	}
	s.gen++
	s.notifyLocked()
	return out, true
}

// Adopt gives key (and pod) the assignment that was re-held from the host
// route to hostVeth after a lost checkpoint (Owner.Recovered), so the pod's
// CHECK and DEL find their address again. It reports false, changing
// nothing, when no recovered assignment is on that veth or key already holds
// an address.
func (d *Store) Adopt(key api.Key, pod api.Pod, hostVeth string) (Assignment, bool) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, held := s.byKey[key]; held || hostVeth == "" {
		return Assignment{}, false
	}
	for old, addr := range s.byKey {
		st := s.addrs[addr]
		if !st.owner.Recovered || st.owner.HostVeth != hostVeth {
			continue
		}
		delete(s.byKey, old)
		st.owner = &Owner{Key: key, Pod: pod, AssignedAt: st.owner.AssignedAt, HostVeth: hostVeth}
		s.byKey[key] = addr
		s.gen++
		s.notifyLocked()
		return s.assignmentLocked(addr, st), true
	}
	return Assignment{}, false
}

// Get returns key's assignment.
func (d *Store) Get(key api.Key) (Assignment, bool) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	addr, ok := s.byKey[key]
	if !ok {
		return Assignment{}, false
	}
	return s.assignmentLocked(addr, s.addrs[addr]), true
}

// Holder returns the assignment holding addr.
func (d *Store) Holder(addr netip.Addr) (Assignment, bool) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.addrs[addr]
	if a == nil || a.owner == nil {
		return Assignment{}, false
	}
	return s.assignmentLocked(addr, a), true
}

// Assignments lists every assignment, by address.
func (d *Store) Assignments() []Assignment {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Assignment, 0, len(s.byKey))
	for _, addr := range s.byKey {
		out = append(out, s.assignmentLocked(addr, s.addrs[addr]))
	}
	sortAssignments(out)
	return out
}

// ENIs lists the known ENIs by device number (copies).
func (d *Store) ENIs() []ENI {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.enisLocked()
}
