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
// (calls+1) × ENIs × segments² exceeds maxWork.
func MinIdleHours(levels []Level, end time.Time, calls, unit, slotsPerENI, maxENIs int, maxWork float64) (hours float64, ok bool) {
	if calls < 0 || unit <= 0 || slotsPerENI <= 0 {
		return 0, false
	}
	c := segmentsOf(levels, end, unit)
	at, u, m, assigned := c.at, c.inUse, len(c.inUse), c.assigned
	if m == 0 {
		return 0, true
	}
	dur := make([]float64, m)
	top := 0 // the most in use
	for i := range m {
		dur[i] = at[i+1].Sub(at[i]).Hours()
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
// filling): the same pods, then one more every 10 s until capacity pods
// run, each staying to the end too. The first comes 10 s after the last
// pod of t, or at from if that is later: TwinBound's argument needs the
// twin to be the same pods until after t_E (pass t_E + 10 s, as TwinAfter
// gets), which a fill whose last pods queue for their sandboxes may not
// reach before its last pod is bound. false: a pod of t leaves before the
// end, t already runs capacity pods, or the last would arrive after t ends.
func TwinFill(t Trace, capacity int, from time.Duration) (Trace, bool) {
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
	first := max(t.Pods[len(t.Pods)-1].Arrive+10*time.Second, from)
	for i := 0; len(twin.Pods) < capacity; i++ {
		at := first + time.Duration(i)*10*time.Second
		if at >= t.Duration {
			return Trace{}, false
		}
		twin.Pods = append(twin.Pods, Pod{Arrive: at, Life: t.Duration - at})
	}
	return twin, true
}

// TwinAfter is a twin of t that no pool can tell from t before from: the
// same pods, and extra more arriving one every 10 s from from on, each
// staying to the end (pods the scheduler places on the node later). false:
// extra < 1, or the last would arrive after t ends.
func TwinAfter(t Trace, from time.Duration, extra int) (Trace, bool) {
	if extra < 1 || from < 0 || from+time.Duration(extra-1)*10*time.Second >= t.Duration {
		return Trace{}, false
	}
	twin := t
	twin.Name = t.Name + "-twin"
	twin.Pods = slices.Clone(t.Pods)
	for i := range extra {
		at := from + time.Duration(i)*10*time.Second
		twin.Pods = append(twin.Pods, Pod{Arrive: at, Life: t.Duration - at})
	}
	return twin, true
}

// TwinFillBound is TwinBound for a filling node (pods only arrive: no
// level where an address is cooling or in use falls), the twin
// TwinFill's, whose pods need twinAddrs addresses; ok is false on any
// other curve.
func TwinFillBound(levels []Level, end time.Time, twinAddrs, callsA, callsTwin, slotsPerENI, maxENIs int) (hours float64, ok bool) {
	prev := 0
	for _, l := range levels {
		if l.InUse < prev || l.InUse != l.Assigned {
			return 0, false
		}
		prev = l.InUse
	}
	return TwinBound(levels, end, twinAddrs, callsA, callsTwin, slotsPerENI, maxENIs)
}

// TwinBound is a lower bound on the idle address-hours, on a node's demand
// curve levels (until end), of any pool that cannot see pods before they
// are bound, makes no pod wait, and makes no more EC2 calls than callsA
// there and callsTwin on a twin trace, in secondary-IP mode. The twin is
// the same pods until after t_E, the first level above (E−1) ×
// slotsPerENI, where E is the ENIs the curve's peak needs (TwinAfter from
// t_E plus 10 s), and its peak in use is twinPeak addresses, more than the
// curve's on the same E ENIs.
//
// It holds when both call counts are the fewest growth takes
// (GrowthCalls(E)): such a pool makes no call beyond growth, so every
// ENI's addresses are set by the call that creates it (the primary ENI's
// by its one assign). At t_E a pod needs an address of the E-th ENI, so
// every one of those calls is done, and what the pool holds is final. Up
// to then the two traces are the same pods, so it is the same on both;
// on the twin it covers twinPeak. So on levels too the pool holds twinPeak
// addresses, plus the primary address of each ENI beyond the first, from
// t_E to end. The bound is that holding less what is assigned, over
// [t_E, end]; nothing before t_E is counted. Pods may leave: a curve that
// falls only adds idle after t_E. The curve is the simulator node's: an
// address is in use until its 30 s cooldown ends (Level.InUse), and "no
// pod waits" means every pod gets an address at its first ADD (none
// waits, none never starts); the pool decides alike on the same events.
//
// ok is false where the argument does not hold: callsA or callsTwin above
// the fewest, twinPeak not above the curve's peak, the twin needing more
// ENIs than the curve or than maxENIs.
func TwinBound(levels []Level, end time.Time, twinPeak, callsA, callsTwin, slotsPerENI, maxENIs int) (hours float64, ok bool) {
	if slotsPerENI <= 0 || len(levels) == 0 {
		return 0, false
	}
	top := PeakInUse(levels)
	enis := func(n int) int { return (n + slotsPerENI - 1) / slotsPerENI }
	e := enis(top)
	if top == 0 || twinPeak <= top || enis(twinPeak) != e || e > maxENIs ||
		callsA != GrowthCalls(e) || callsTwin != GrowthCalls(e) {
		return 0, false
	}
	held := float64(twinPeak + e - 1)
	from := slices.IndexFunc(levels, func(l Level) bool { return l.InUse > (e-1)*slotsPerENI })
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

// TwinFrom is t_E of TwinBound on levels: the time from start of the first
// level above (E−1) × slotsPerENI, E the ENIs the curve's peak needs;
// false on an empty curve.
func TwinFrom(levels []Level, start time.Time, slotsPerENI int) (time.Duration, bool) {
	top := PeakInUse(levels)
	if top == 0 || slotsPerENI <= 0 {
		return 0, false
	}
	e := (top + slotsPerENI - 1) / slotsPerENI
	i := slices.IndexFunc(levels, func(l Level) bool { return l.InUse > (e-1)*slotsPerENI })
	return levels[i].At.Sub(start), true
}

func earliestTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// curve is a demand curve cut into the segments a bound needs: from the
// first demand on (before it, holding nothing is free and takes no call),
// a new segment wherever the slots in use change.
type curve struct {
	at       []time.Time // segment i is [at[i], at[i+1]); the last at is end
	inUse    []int       // the most addresses in use in each segment, rounded up to whole slots
	assigned float64     // address-hours assigned to pods over the whole curve (Level.Assigned)
}

// segmentsOf cuts levels (Result.Levels) until end into a curve. A bound
// depends on the addresses in use only through the slots (of unit
// addresses) that hold them, so levels that keep the slots in use are one
// segment; what is assigned is only ever summed.
func segmentsOf(levels []Level, end time.Time, unit int) curve {
	var c curve
	slots := func(n int) int { return (n + unit - 1) / unit * unit }
	for i, l := range levels {
		if !l.At.Before(end) {
			break
		}
		next := end
		if i+1 < len(levels) && levels[i+1].At.Before(end) {
			next = levels[i+1].At
		}
		c.assigned += float64(l.Assigned) * next.Sub(l.At).Hours()
		if len(c.inUse) == 0 && l.InUse == 0 {
			continue
		}
		s := slots(l.InUse)
		if n := len(c.at); n > 0 && c.at[n-1].Equal(l.At) {
			c.inUse[n-1] = s
		} else {
			c.at = append(c.at, l.At)
			c.inUse = append(c.inUse, s)
		}
		if n := len(c.inUse); n > 1 && c.inUse[n-2] == c.inUse[n-1] {
			c.at, c.inUse = c.at[:n-1], c.inUse[:n-1]
		}
	}
	// A level at the first demand's instant may have taken it back: the
	// curve starts at its first segment with something in use.
	for len(c.inUse) > 0 && c.inUse[0] == 0 {
		c.at, c.inUse = c.at[1:], c.inUse[1:]
	}
	if len(c.inUse) > 0 {
		c.at = append(c.at, end)
	}
	return c
}

// CoarseMinIdleHours is a lower bound like MinIdleHours, weaker but
// computable on any curve: for the curves whose exact bound would exceed
// maxWork (hundreds of calls over tens of thousands of segments). On the
// same arguments it is never above MinIdleHours.
//
// It relaxes MinIdleHours further:
//   - ENIs are not tracked: every change costs one call (the first piece's
//     assign too), and a piece holds at least the primary address of each
//     ENI its peak needs beyond the first;
//   - the curve is cut into blocks of consecutive segments, as many as
//     maxWork allows (blocks² × (calls+1) ≤ maxWork). Each block is either
//     inside one piece (held at least the piece's peak for the whole
//     block) or holds a change somewhere inside. Such a block is charged
//     only the floor of each of its instants (Result.FloorHours) and one
//     call, whatever happens in it. A change exactly at a block's edge costs its
//     call and no block.
//
// Every real sequence of pieces maps to one of these: its changes inside a
// block mark the block, and each of its pieces holds at least the peak of
// the unmarked blocks it covers, so no pool does better. ok is false on
// bad arguments and when maxWork is below calls+1 (not even one block);
// +Inf with ok: no pool serves the curve with calls.
func CoarseMinIdleHours(levels []Level, end time.Time, calls, unit, slotsPerENI, maxENIs int, maxWork float64) (hours float64, ok bool) {
	if calls < 0 || unit <= 0 || slotsPerENI <= 0 || maxWork < 1 {
		return 0, false
	}
	c := segmentsOf(levels, end, unit)
	m := len(c.inUse)
	if m == 0 {
		return 0, true
	}
	inf := math.Inf(1)
	if calls == 0 {
		return inf, true
	}
	// rate: the least address-hours per hour held while h addresses are in
	// use (h in whole slots): the slots and the primary address of each
	// ENI they need beyond the first; +Inf beyond maxENIs.
	rate := func(h int) float64 {
		enis := max((h/unit+slotsPerENI-1)/slotsPerENI, 1)
		if enis > max(maxENIs, 1) {
			return inf
		}
		return float64(h + enis - 1)
	}
	nb := min(m, int(math.Sqrt(maxWork/float64(calls+1))))
	if nb < 1 {
		return 0, false
	}
	k := min(calls, 2*nb+1) // more calls than blocks and edges never help
	peak := make([]int, nb)
	span := make([]float64, nb)
	low := make([]float64, nb) // the floor's address-hours
	for b := range nb {
		for s := b * m / nb; s < (b+1)*m/nb; s++ {
			d := c.at[s+1].Sub(c.at[s]).Hours()
			peak[b] = max(peak[b], c.inUse[s])
			span[b] += d
			low[b] += rate(c.inUse[s]) * d
		}
	}
	// piece[j][n], marked[j][n]: least held address-hours covering blocks
	// [0, j) with n calls, the last block ending a piece, or marked (the
	// start counts as marked: the first piece's call is already spent).
	w := k + 1
	piece := make([]float64, (nb+1)*w)
	marked := make([]float64, (nb+1)*w)
	for i := range piece {
		piece[i], marked[i] = inf, inf
	}
	marked[1] = 0
	for j := 1; j <= nb; j++ {
		for n := 0; n < k; n++ {
			if v := min(piece[(j-1)*w+n], marked[(j-1)*w+n]) + low[j-1]; v < marked[j*w+n+1] {
				marked[j*w+n+1] = v
			}
		}
		hi, length := 0, 0.0
		for i := j - 1; i >= 0; i-- {
			hi = max(hi, peak[i])
			length += span[i]
			r := rate(hi)
			if r == inf {
				break
			}
			held := r * length
			for n := 0; n <= k; n++ {
				if v := marked[i*w+n] + held; v < piece[j*w+n] {
					piece[j*w+n] = v
				}
				if n < k {
					if v := piece[i*w+n] + held; v < piece[j*w+n+1] {
						piece[j*w+n+1] = v
					}
				}
			}
		}
	}
	best := inf
	for n := 0; n <= k; n++ {
		best = min(best, piece[nb*w+n], marked[nb*w+n])
	}
	if best == inf {
		return inf, true
	}
	return max(best-c.assigned, 0), true
}

// PeakInUse is the most addresses in use (assigned or cooling) at once on
// the curve levels; 0 on an empty curve.
func PeakInUse(levels []Level) int {
	top := 0
	for _, l := range levels {
		top = max(top, l.InUse)
	}
	return top
}
