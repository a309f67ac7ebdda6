// Package warmpool is vpcip's pool-sizing policy as pure functions: given the
// node's ENIs and their address slots, the node's limits, the warm-pool
// configuration (the AWS VPC CNI variables WARM_ENI_TARGET, WARM_IP_TARGET,
// MINIMUM_IP_TARGET, WARM_PREFIX_TARGET, MAX_ENI) and the current demand, Next
// returns the one next action the daemon should take through the cloud.
//
// No I/O, no goroutines, no clock reads: the caller passes Now. Same input,
// same plan. The standard library only.
//
// The daemon loops: observe, call Next, execute the plan, feed the outcome
// (new state, or a Refusal) back, and call Next again until it returns
// Nothing or Wait. Every count is in addresses unless its name or comment
// says prefixes (/28, 16 addresses each) or slots (one /32 or one /28).
//
// Rules and their sources (AWS VPC CNI, docs/eni-and-ip-target.md and
// docs/prefix-and-ip-target.md of amazon-vpc-cni-k8s, unless marked vpcip):
//   - WARM_IP_TARGET and MINIMUM_IP_TARGET, when either is set, take
//     precedence over WARM_ENI_TARGET and WARM_PREFIX_TARGET. Shortfall is
//     max(WARM_IP_TARGET − available, MINIMUM_IP_TARGET − total, 0); surplus
//     is min(available − WARM_IP_TARGET, total − MINIMUM_IP_TARGET), at
//     least 0. In prefix mode both round to whole /28 prefixes.
//   - Otherwise, in prefix mode, WARM_PREFIX_TARGET (default 1) whole free
//     /28 prefixes are kept; WARM_ENI_TARGET is not used.
//   - Otherwise WARM_ENI_TARGET (default 1) whole ENIs' worth of free
//     addresses are kept, and ENIs are filled whole.
//   - vpcip: with Config.Adaptive and none of the targets above set, the
//     adaptive policy sizes the pool by demand instead (adaptive.go).
//   - Growth fills an attached ENI that has room before creating one, and a
//     new ENI gets its addresses in the same call. Never beyond Limits.MaxENIs
//     (the instance limit, capped by MAX_ENI) or Limits.MaxPods.
//   - Surplus addresses are released only under WARM_IP_TARGET or
//     MINIMUM_IP_TARGET; surplus whole free prefixes also beyond
//     WARM_PREFIX_TARGET (reference ipamd, prefix mode). At most one release
//     or ENI deletion per Config.ReleaseInterval.
//   - An ENI is deleted only when it is not the primary, holds no assigned
//     and no cooling address, is at least Config.ENIMinAge old, and the
//     targets still hold without it.
//   - vpcip: addresses in cooldown count toward the total but are not
//     available (reference issues #2896, #1700).
//   - vpcip: Input.Pending adds to the shortfall, so waiting pods are covered
//     in one call instead of one warm batch per round trip.
//   - vpcip: refusals from the cloud are inputs (see Refusal): growth falls
//     back or waits instead of repeating a failing call; shrinking is never
//     blocked by them.
package warmpool

import (
	"net/netip"
	"time"
)

// Defaults applied when the corresponding Config field is zero.
const (
	// DefaultReleaseInterval is the minimum time between two releases
	// (addresses, prefixes or an ENI): 30 seconds, the interval at which the
	// reference ipamd considers decreasing the pool.
	DefaultReleaseInterval = 30 * time.Second
	// DefaultENIMinAge is the minimum age of an ENI before it may be deleted:
	// one minute, the reference datastore's minimum ENI lifetime (a young
	// ENI is kept while instance metadata catches up with it).
	DefaultENIMinAge = time.Minute
	// DefaultWarmENITarget is WARM_ENI_TARGET when neither it nor any IP
	// target is set: one ENI's worth of free addresses (reference default).
	DefaultWarmENITarget = 1
	// DefaultWarmPrefixTarget is WARM_PREFIX_TARGET in prefix mode when
	// neither it nor any IP target is set: one whole free /28 prefix.
	DefaultWarmPrefixTarget = 1
	// PrefixAddresses is the number of addresses in one delegated /28
	// prefix (EC2 prefix delegation).
	PrefixAddresses = 16
)

// Slot is one unit of ENI capacity: a secondary address (a /32) or, in prefix
// mode, a delegated /28 prefix (16 addresses). EC2 counts each slot, /32 or
// /28, against the ENI's IPv4 address limit.
type Slot struct {
	Prefix   netip.Prefix // /32 address or /28 prefix
	Assigned int          // addresses of this slot held by pods
	Cooling  int          // addresses of this slot released less than IP_COOLDOWN_PERIOD ago
	// CoolingUntil is when the slot's last cooling address becomes free;
	// zero: unknown (the adaptive policy then never waits for it).
	CoolingUntil time.Time
}

// Size is the number of addresses in the slot: 1 for a /32, 16 for a /28,
// 0 for an invalid prefix.
func (s Slot) Size() int {
	if !s.Prefix.IsValid() {
		return 0
	}
	return 1 << (s.Prefix.Addr().BitLen() - s.Prefix.Bits())
}

// Free is the number of the slot's addresses a pod could get now, in
// addresses: Size − Assigned − Cooling, at least 0 (negative counts read as
// 0). Cooling addresses are not free (reference issues #2896, #1700).
func (s Slot) Free() int { return max(s.Size()-max(s.Assigned, 0)-max(s.Cooling, 0), 0) }

// ENI is the state of one attached ENI.
type ENI struct {
	ID       string    // EC2 network interface ID, e.g. "eni-0123456789abcdef0"; ties between ENIs are broken by it
	Primary  bool      // the instance's primary ENI (device 0): never deleted
	Attached time.Time // when it was attached; ENIs younger than Config.ENIMinAge are not deleted
	Slots    []Slot    // secondary addresses and prefixes; the ENI's own primary address is not a slot
}

// Limits are the node's limits.
type Limits struct {
	MaxENIs         int  // ENIs the instance type allows on network card 0, already capped by MAX_ENI
	SlotsPerENI     int  // secondary addresses (or /28 prefixes) per ENI: IPv4 per ENI − 1 (EC2 DescribeInstanceTypes)
	MaxPods         int  // pods the node may run; 0: no limit beyond ENIs. Growth stops once the node holds this many addresses
	PrefixSupported bool // the instance type supports prefix delegation (Nitro); without it PrefixDelegation is ignored
}

// Config is the warm-pool configuration, with AWS VPC CNI meaning. A zero
// target is unset. Counts are addresses unless named for prefixes or ENIs.
type Config struct {
	WarmENITarget    int           // WARM_ENI_TARGET: whole ENIs' worth of free addresses to keep (default 1; unused in prefix mode)
	WarmIPTarget     int           // WARM_IP_TARGET: free addresses to keep
	MinimumIPTarget  int           // MINIMUM_IP_TARGET: floor on total addresses (assigned + free + cooling)
	WarmPrefixTarget int           // WARM_PREFIX_TARGET: whole free /28 prefixes to keep (prefix mode, default 1)
	PrefixDelegation bool          // ENABLE_PREFIX_DELEGATION: assign /28 prefixes instead of single addresses
	ReleaseInterval  time.Duration // at most one release per interval (default 30 s); shorter, it also scales the adaptive policy's windows (see adaptive.go)
	ENIMinAge        time.Duration // an ENI younger than this is not deleted (default 1 minute)
	// Adaptive selects vpcip's default policy, sized by demand (see
	// Demand and the constants of adaptive.go). It is what the daemon runs
	// when no warm variable is set; any of WarmIPTarget, MinimumIPTarget,
	// WarmENITarget, WarmPrefixTarget above 0 takes precedence, with the
	// AWS VPC CNI meaning.
	Adaptive bool
	// KeepFallback turns off the conversion of the no-/28 fallback's free
	// single addresses back into /28s (convert.go): they stay until the
	// policy releases them as surplus, as before the conversion. For
	// comparisons (make bench-frag); the daemon never sets it.
	KeepFallback bool
}

// Refusal is a recent refusal from the cloud, fed back so the plan falls back
// or waits instead of repeating a failing call every cycle. Refusals only
// constrain growth (Assign, CreateENI); they never block Release or
// DeleteENI. A refusal whose Until is not after Input.Now is ignored.
type Refusal struct {
	Kind  RefusalKind
	Until time.Time // the refusal is taken into account until this time
	ENI   string    // RefusedAddressLimit: the ENI that refused; empty: every attached ENI
	// Count is the size of the refused request, in slots (RefusedSubnetFull,
	// and RefusedNoPrefix for a request of more than one /28: EC2 refuses
	// the whole request when the subnet has fewer free aligned /28s).
	// The subnet may still hold fewer free addresses (or /28s) than were
	// asked for, so while the refusal is in force growth asks for at most
	// half as many (14, 7, 3, 1). Only once a single slot was refused (or
	// Count is 0: unknown) does a full subnet make growth wait and a
	// RefusedNoPrefix send it to single addresses. Each further refusal
	// halves again.
	Count int
}

// RefusalKind classifies a cloud refusal. Each kind matches one of the
// provider package's sentinel errors, named in its comment.
type RefusalKind int

const (
	RefusedENILimit     RefusalKind = iota + 1 // provider.ErrENILimit (EC2 AttachmentLimitExceeded): no CreateENI
	RefusedAddressLimit                        // provider.ErrAddressLimit (EC2 PrivateIpAddressLimitExceeded, stale view): no Assign on Refusal.ENI
	RefusedSubnetFull                          // provider.ErrSubnetFull (EC2 InsufficientFreeAddressesInSubnet): ask for half of Refusal.Count; Wait once one slot was refused
	RefusedNoPrefix                            // provider.ErrInsufficientCIDR (EC2 InsufficientCidrBlocks): no aligned free /28, single addresses instead
	RefusedThrottled                           // provider.ErrThrottled (EC2 RequestLimitExceeded): no growth, Wait
)

// String is the refusal's lower-case name, fit for a metric label.
func (k RefusalKind) String() string {
	switch k {
	case RefusedENILimit:
		return "eni_limit"
	case RefusedAddressLimit:
		return "address_limit"
	case RefusedSubnetFull:
		return "subnet_full"
	case RefusedNoPrefix:
		return "no_prefix"
	case RefusedThrottled:
		return "throttled"
	}
	return "unknown"
}

// Input is everything Next looks at.
type Input struct {
	ENIs        []ENI
	Limits      Limits
	Config      Config
	Pending     int       // pods waiting for an address now (ADDs that found none, scheduled pods not started); one address each
	Demand      Demand    // recent arrivals and pods without an address (adaptive policy)
	Now         time.Time // the caller's clock; Next never reads one
	LastRelease time.Time // when addresses or an ENI were last released; zero: never
	LastGrow    time.Time // when addresses or an ENI were last added; zero: never (adaptive policy)
	Refusals    []Refusal
}

// ActionKind is what the plan asks for.
type ActionKind int

const (
	Nothing   ActionKind = iota // the pool is at target, or short but at a static limit (MaxENIs, MaxPods)
	Assign                      // assign Count addresses (or prefixes) on ENI (EC2 AssignPrivateIpAddresses)
	CreateENI                   // create and attach an ENI with Count addresses (or prefixes) (EC2 CreateNetworkInterface, AttachNetworkInterface)
	Release                     // unassign Release (free /32s or /28s) from ENI (EC2 UnassignPrivateIpAddresses)
	DeleteENI                   // detach and delete ENI (EC2 DetachNetworkInterface, DeleteNetworkInterface)
	Wait                        // the pool is short but a refusal says not to call now
)

// String is the action's lower-case name, fit for a metric label.
func (k ActionKind) String() string {
	switch k {
	case Nothing:
		return "nothing"
	case Assign:
		return "assign"
	case CreateENI:
		return "create_eni"
	case Release:
		return "release"
	case DeleteENI:
		return "delete_eni"
	case Wait:
		return "wait"
	}
	return "unknown"
}

// Plan is one action and its reason (for logs and metrics).
type Plan struct {
	Action   ActionKind
	ENI      string         // Assign, Release, DeleteENI
	Count    int            // Assign, CreateENI: addresses, or /28 prefixes when Prefixes
	Prefixes bool           // Count counts /28 prefixes
	Release  []netip.Prefix // Release: /32 addresses or /28 prefixes, none of them assigned or cooling, in address order
	Reason   string         // one line, e.g. "short 5 addresses (WARM_IP_TARGET 5, available 0)"
	// Until is when calling Next again may give a different plan without any
	// change in state: for Wait, when the blocking refusals expire; for
	// Nothing, when a due release or ENI deletion becomes allowed
	// (Config.ReleaseInterval, Config.ENIMinAge). Zero: no such time.
	Until time.Time
	// Wanted is, for the adaptive policy, the addresses the pool wanted to
	// hold when it planned: those assigned and cooling plus low (need,
	// ahead and margin; without ahead while room serves a burst), in
	// addresses; 0 for the other policies. The
	// caller records it with History.Want, so a later release can tell
	// whether the level it goes down to would have been short then.
	Wanted int
}
