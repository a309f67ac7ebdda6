// Package warmpool is vpcip's pool-sizing policy as pure functions: given the
// node's ENIs and their address slots, the node's limits, the warm-pool
// configuration (the AWS VPC CNI variables WARM_ENI_TARGET, WARM_IP_TARGET,
// MINIMUM_IP_TARGET, WARM_PREFIX_TARGET, MAX_ENI) and the current demand, Plan
// returns the one next action the daemon should take through the cloud.
//
// No I/O, no goroutines, no clock reads: the caller passes Now. Same input,
// same plan. The standard library only.
package warmpool

import (
	"net/netip"
	"time"
)

// Slot is one unit of ENI capacity: a secondary address (a /32) or, in prefix
// mode, a delegated /28 prefix (16 addresses).
type Slot struct {
	Prefix   netip.Prefix // /32 address or /28 prefix
	Assigned int          // addresses of this slot held by pods
	Cooling  int          // addresses of this slot released less than IP_COOLDOWN_PERIOD ago
}

// Size is the number of addresses in the slot: 1 for a /32, 16 for a /28.
func (s Slot) Size() int {
	if !s.Prefix.IsValid() {
		return 0
	}
	return 1 << (s.Prefix.Addr().BitLen() - s.Prefix.Bits())
}

// Free is the number of the slot's addresses a pod could get now.
func (s Slot) Free() int { return max(s.Size()-s.Assigned-s.Cooling, 0) }

// ENI is the state of one attached ENI.
type ENI struct {
	ID       string
	Primary  bool      // the instance's primary ENI (device 0): never deleted
	Attached time.Time // when it was attached; ENIs younger than Config.ENIMinAge are not deleted
	Slots    []Slot    // secondary addresses and prefixes; the ENI's own primary address is not a slot
}

// Limits are the node's limits.
type Limits struct {
	MaxENIs         int // ENIs the instance type allows on network card 0, already capped by MAX_ENI
	SlotsPerENI     int // secondary addresses (or /28 prefixes) per ENI: IPv4 per ENI − 1
	MaxPods         int // pods the node may run; 0: no limit beyond ENIs
	PrefixSupported bool
}

// Config is the warm-pool configuration, with AWS VPC CNI meaning. A zero
// target is unset.
type Config struct {
	WarmENITarget    int           // whole ENIs' worth of free addresses to keep (default 1)
	WarmIPTarget     int           // free addresses to keep
	MinimumIPTarget  int           // floor on total addresses (assigned + free + cooling)
	WarmPrefixTarget int           // free /28 prefixes to keep (prefix mode)
	PrefixDelegation bool          // assign /28 prefixes instead of single addresses
	ReleaseInterval  time.Duration // at most one release per interval (default 30 s)
	ENIMinAge        time.Duration // an ENI younger than this is not deleted (default 1 minute)
}

// Refusal is a recent refusal from the cloud, fed back so the plan falls back
// or waits instead of repeating a failing call every cycle.
type Refusal struct {
	Kind  RefusalKind
	Until time.Time // the refusal is taken into account until this time
}

// RefusalKind classifies a cloud refusal.
type RefusalKind int

const (
	RefusedENILimit     RefusalKind = iota + 1 // no more ENIs can be attached
	RefusedAddressLimit                        // the ENI holds its maximum (stale view)
	RefusedSubnetFull                          // the subnet has no free address
	RefusedNoPrefix                            // the subnet has no aligned free /28: fall back to single addresses
	RefusedThrottled                           // API throttled: wait
)

// Input is everything Plan looks at.
type Input struct {
	ENIs        []ENI
	Limits      Limits
	Config      Config
	Pending     int // pods waiting for an address now (ADDs that found none, scheduled pods not started)
	Now         time.Time
	LastRelease time.Time // when addresses or an ENI were last released
	Refusals    []Refusal
}

// ActionKind is what the plan asks for.
type ActionKind int

const (
	Nothing   ActionKind = iota // the pool is at target
	Assign                      // assign Count addresses (or prefixes) on ENI
	CreateENI                   // create and attach an ENI with Count addresses (or prefixes)
	Release                     // unassign Release (free /32s or /28s) from ENI
	DeleteENI                   // detach and delete ENI
	Wait                        // the pool is short but a refusal says not to call now
)

// Plan is one action and its reason (for logs and metrics).
type Plan struct {
	Action   ActionKind
	ENI      string         // Assign, Release, DeleteENI
	Count    int            // Assign, CreateENI: addresses, or /28 prefixes when Prefixes
	Prefixes bool           // Count counts /28 prefixes
	Release  []netip.Prefix // Release: /32 addresses or /28 prefixes, none of them assigned or cooling
	Reason   string         // one line, e.g. "short 5 addresses (WARM_IP_TARGET 5, available 0)"
}
