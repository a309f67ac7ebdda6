package poolsim

import (
	"math"
	"slices"
	"time"
)

// MinIdleHours is a lower bound on the idle address-hours of any pool, online
// or with the whole trace known in advance, that makes no pod wait and makes
// at most calls EC2 mutating calls, on a node whose demand curve is levels
// (Result.Levels) until end. unit is the addresses one slot holds (1, or 16
// in prefix mode), slotsPerENI the slots one ENI holds and maxENIs the
// instance's ENI limit; the node starts with its primary ENI and no slot.
//
// The bound relaxes the pool's constraints, so no real pool does better.
// What the pool holds is a sequence of pieces, each a number of addresses h
// and of attached ENIs E, held over a span of the curve:
//   - h is never below the demand, Level.InUse (no pod waits: an address is
//     free at each ADD; cooling addresses are neither handed out nor
//     released), and is held as whole slots on E ENIs (E × slotsPerENI
//     slots at most);
//   - idle is, as in Result.IdleHours, what is held and not assigned to a
//     pod (Level.Assigned): the slots' free and cooling addresses, plus the
//     primary address of each ENI beyond the first. At every instant a
//     piece holds at least what Result.FloorHours counts (the in-use
//     addresses in whole slots, and the primary addresses of the ENIs
//     they need), so the bound is never below that floor on the same
//     curve;
//   - going from one piece to the next costs, at least: 3 calls per ENI
//     created (CreateNetworkInterface, AttachNetworkInterface,
//     ModifyNetworkInterfaceAttribute; its addresses come with it, and any
//     other change too), 2 per ENI deleted (DetachNetworkInterface,
//     DeleteNetworkInterface; any other change too), else 1 (one assign or
//     release, whatever its size or how many ENIs it touches);
//   - the first piece starts from the bare primary ENI, so what it holds
//     beyond the slots of the ENIs it creates is on the primary ENI and
//     takes one more call (AssignPrivateIpAddresses or, in prefix mode,
//     AssignIpv4Prefixes: EC2 puts no slot on an attached ENI otherwise).
//     Later pieces are not charged for that: which ENIs the previous
//     piece's slots were on is not tracked, so "any other change" stays
//     free there, and the bound stays a bound.
//
// The fewest idle address-hours over all such sequences of at most calls
// calls is found exactly by dynamic programming over the curve's segments,
// in O(calls × ENIs × segments²). ok is false, and nothing computed, when
// calls × ENIs × segments² exceeds maxWork.
func MinIdleHours(levels []Level, end time.Time, calls, unit, slotsPerENI, maxENIs int, maxWork float64) (hours float64, ok bool) {
	// Segments from the first demand on: before it, holding nothing is
	// free and takes no call.
	var at []time.Time
	var u, a []int // in use (held at least), assigned (not idle)
	for _, l := range levels {
		if len(u) == 0 && l.InUse == 0 {
			continue
		}
		if !l.At.Before(end) {
			break
		}
		if len(u) > 0 && u[len(u)-1] == l.InUse && a[len(a)-1] == l.Assigned {
			continue
		}
		if len(at) > 0 && at[len(at)-1].Equal(l.At) {
			u[len(u)-1], a[len(a)-1] = l.InUse, l.Assigned
			continue
		}
		at = append(at, l.At)
		u, a = append(u, l.InUse), append(a, l.Assigned)
	}
	m := len(u)
	if m == 0 {
		return 0, true
	}
	if calls < 0 || unit <= 0 || slotsPerENI <= 0 {
		return 0, false
	}
	at = append(at, end)
	dur := make([]float64, m)
	assigned, top := 0.0, 0 // ∫ assigned in address-hours; the most in use
	for i := range m {
		dur[i] = at[i+1].Sub(at[i]).Hours()
		assigned += float64(a[i]) * dur[i]
		top = max(top, u[i])
	}
	slotsOf := func(h int) int { return (h + unit - 1) / unit }
	enisOf := func(h int) int { return max((slotsOf(h)+slotsPerENI-1)/slotsPerENI, 1) }
	nE := min(enisOf(top), max(maxENIs, 1)) // more ENIs than the peak needs never help
	if enisOf(top) > nE {
		return math.Inf(1), true // the demand exceeds the instance: no pool serves it
	}
	if float64(calls+1)*float64(nE)*float64(m)*float64(m) > maxWork {
		return 0, false
	}
	inf := math.Inf(1)
	// g[k][j][e]: least held address-hours covering segments [0, j) with
	// k calls, the last piece on e+1 ENIs. Index k·(m+1)·nE + j·nE + e.
	g := make([]float64, (calls+1)*(m+1)*nE)
	for i := range g {
		g[i] = inf
	}
	idx := func(k, j, e int) int { return (k*(m+1)+j)*nE + e }
	// into[k][e]: least cost of ending a piece at the current i with k
	// calls spent once the next piece, on e+1 ENIs, has started.
	into := make([]float64, (calls+1)*nE)
	cost := func(from, to int) int { // calls to go from from+1 to to+1 ENIs
		switch {
		case to > from:
			return 3 * (to - from)
		case to < from:
			return 2 * (from - to)
		}
		return 1
	}
	// best[i][k][e]: computed when i's g is final (all j > i come later).
	best := make([]float64, (m+1)*(calls+1)*nE)
	bidx := func(i, k, e int) int { return (i*(calls+1)+k)*nE + e }
	fill := func(i int) {
		for k := 0; k <= calls; k++ {
			for e := range nE {
				into[k*nE+e] = inf
			}
		}
		for k := 0; k <= calls; k++ {
			for e1 := range nE {
				var v float64
				if i == 0 {
					if k != 0 || e1 != 0 {
						continue
					}
					v = 0 // the start: the primary ENI, nothing held
				} else {
					v = g[idx(k, i, e1)]
				}
				if v == inf {
					continue
				}
				for e := range nE {
					k2 := k + cost(e1, e)
					if k2 <= calls && v < into[k2*nE+e] {
						into[k2*nE+e] = v
					}
				}
			}
		}
		copy(best[bidx(i, 0, 0):bidx(i, calls, nE-1)+1], into)
	}
	fill(0)
	for j := 1; j <= m; j++ {
		hi, span := 0, 0.0
		for i := j - 1; i >= 0; i-- {
			hi = max(hi, u[i])
			span += dur[i]
			need := enisOf(hi) - 1
			for e := need; e < nE; e++ {
				held := float64(slotsOf(hi)*unit+e) * span
				if i == 0 {
					// The first piece, from the bare primary ENI: the e
					// ENIs it creates carry at most e × slotsPerENI
					// slots; any more are on the primary ENI, which
					// takes an assign call of its own.
					k := 3 * e
					if slotsOf(hi) > e*slotsPerENI {
						k++
					}
					if k <= calls && held < g[idx(k, j, e)] {
						g[idx(k, j, e)] = held
					}
					continue
				}
				for k := 0; k <= calls; k++ {
					b := best[bidx(i, k, e)]
					if b == inf {
						continue
					}
					if c := b + held; c < g[idx(k, j, e)] {
						g[idx(k, j, e)] = c
					}
				}
			}
		}
		fill(j)
	}
	low := inf
	for k := 0; k <= calls; k++ {
		for e := range nE {
			low = min(low, g[idx(k, m, e)])
		}
	}
	if low == inf {
		return inf, true
	}
	return max(low-assigned, 0), true
}

// GrowthCalls is the fewest EC2 mutating calls with which a node whose
// primary ENI holds no address yet comes to hold addresses on enis ENIs
// (1 or more), in secondary-IP mode: one AssignPrivateIpAddresses on the
// primary ENI and, for each other ENI, CreateNetworkInterface (its
// addresses come with it), AttachNetworkInterface and
// ModifyNetworkInterfaceAttribute.
func GrowthCalls(enis int) int { return 1 + 3*max(enis-1, 0) }

// TwinFill is the twin of a trace whose pods all stay to its end (a node
// filling): the same pods, then one more every 10 s after the last until
// capacity pods run, each staying to the end too. false: a pod of t leaves
// before the end, or t already runs capacity pods.
func TwinFill(t Trace, capacity int) (Trace, bool) {
	if len(t.Pods) == 0 || len(t.Pods) >= capacity {
		return Trace{}, false
	}
	for _, p := range t.Pods {
		if p.Arrive+p.Life < t.Duration {
			return Trace{}, false
		}
	}
	twin := t
	twin.Name = t.Name + "-twin"
	twin.Pods = slices.Clone(t.Pods)
	last := t.Pods[len(t.Pods)-1].Arrive
	for i := 1; len(twin.Pods) < capacity; i++ {
		at := last + time.Duration(i)*10*time.Second
		if at >= t.Duration {
			return Trace{}, false
		}
		twin.Pods = append(twin.Pods, Pod{Arrive: at, Life: t.Duration - at})
	}
	return twin, true
}

// TwinFillBound is a lower bound on the idle address-hours, on a filling
// node's demand curve levels (until end; pods only arrive), of any pool
// that cannot see pods before they are bound, makes no pod wait, and makes
// no more EC2 calls than callsA there and callsTwin on the twin
// (TwinFill), whose pods need twinAddrs addresses, in secondary-IP mode.
//
// It holds when both call counts are the fewest growth takes
// (GrowthCalls of the ENIs the pods need, the same for both): such a pool
// makes no call beyond growth, so every ENI's addresses are set by the
// call that creates it (the primary ENI's by its one assign), and the twin
// needs twinAddrs of them by the time its first pod on the last ENI comes
// (t_E, the first level above (E−1) × slotsPerENI). Until after the last
// pod of levels the two traces are the same pods, so the pool has made
// the same calls on both by t_E: on levels it too holds twinAddrs
// addresses, plus the primary address of each ENI beyond the first, from
// t_E to end, with no call left to give them back. The bound is that
// holding less what is assigned, over [t_E, end]; nothing before t_E is
// counted.
//
// ok is false where the argument does not hold: a level where an address
// is cooling or in use falls (a pod left), callsA or callsTwin above the
// fewest, twinAddrs not above the curve's peak, the twin needing more ENIs
// than the curve or than maxENIs.
func TwinFillBound(levels []Level, end time.Time, twinAddrs, callsA, callsTwin, slotsPerENI, maxENIs int) (hours float64, ok bool) {
	if slotsPerENI <= 0 || len(levels) == 0 {
		return 0, false
	}
	top, prev := 0, 0
	for _, l := range levels {
		if l.InUse < prev || l.InUse != l.Assigned {
			return 0, false
		}
		prev = l.InUse
		top = max(top, l.InUse)
	}
	enis := func(n int) int { return (n + slotsPerENI - 1) / slotsPerENI }
	e := enis(top)
	if top == 0 || twinAddrs <= top || enis(twinAddrs) != e || e > maxENIs ||
		callsA != GrowthCalls(e) || callsTwin != GrowthCalls(e) {
		return 0, false
	}
	held := float64(twinAddrs + e - 1)
	from := -1
	for i, l := range levels {
		if l.InUse > (e-1)*slotsPerENI {
			from = i
			break
		}
	}
	for i := from; i < len(levels); i++ {
		at, next := levels[i].At, end
		if i+1 < len(levels) {
			next = levels[i+1].At
		}
		if !at.Before(end) {
			break
		}
		next = earliestTime(next, end)
		hours += (held - float64(levels[i].Assigned)) * next.Sub(at).Hours()
	}
	return hours, true
}

func earliestTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
