package warmpool

import (
	"slices"
	"time"
)

// History is what the adaptive policy remembers of a node's recent
// demand: the arrivals (address requests) of the last ChunkMemory, and per
// minute the largest burst, the most addresses in use and the most the
// pool wanted held (Plan.Wanted), for max(BurstMemory, WantMemory)
// (both, and the minute, in the time scale of the Config it was made for).
// The zero value is empty, for the default time scale; NewHistory makes
// one for a Config. It holds ChunkMemory's arrivals plus about 155 minutes;
// Record, Observe and Want are amortized O(1). The caller keeps it: Record
// at each address request, Observe with each snapshot it plans with, Want
// with each plan's Wanted, and passes it in Input.Demand with the same
// Config.
type History struct {
	recent []time.Time // within ChunkMemory of the last Record, oldest first
	peaks  []peak      // per minute, oldest first, within max(BurstMemory, WantMemory)
	at     time.Time   // the latest time a minute was recorded at (minute's t)
	seen   bool        // an arrival was recorded
	first  time.Time   // the first arrival recorded
	fresh  bool        // an arrival was recorded since the last Observe
	scale  float64     // timeScale of its Config; 0: 1
}

// NewHistory returns an empty History in c's time scale (see scaled).
func NewHistory(c Config) History { return History{scale: c.timeScale()} }

// span is d in the history's time scale.
func (h History) span(d time.Duration) time.Duration {
	if h.scale <= 0 || h.scale >= 1 {
		return d
	}
	return time.Duration(float64(d) * h.scale)
}

type peak struct {
	minute time.Time
	burst  int // most arrivals within BurstWindow
	inUse  int // most addresses assigned or cooling
	want   int // most addresses the pool wanted held (Plan.Wanted)
}

// Record adds an arrival at t (not before the previous one) and returns
// the updated history; the receiver's storage may be reused.
func (h History) Record(t time.Time) History {
	cut := 0
	for cut < len(h.recent) && t.Sub(h.recent[cut]) > h.span(ChunkMemory) {
		cut++
	}
	h.recent = append(h.recent[cut:], t)
	if !h.seen {
		h.first = t
	}
	h.seen, h.fresh = true, true
	h = h.minute(t)
	last := &h.peaks[len(h.peaks)-1]
	last.burst = max(last.burst, h.within(t, BurstWindow))
	return h
}

// Observe records that inUse addresses were assigned or cooling at t, if
// a pod arrived since the last Observe (the level demand reached, not the
// cooldown's tail after pods left), and returns the updated history.
func (h History) Observe(t time.Time, inUse int) History {
	if !h.fresh {
		return h
	}
	h.fresh = false
	h = h.minute(t)
	last := &h.peaks[len(h.peaks)-1]
	last.inUse = max(last.inUse, inUse)
	return h
}

// Want records that the pool wanted n addresses held at t (Plan.Wanted),
// in a minute a pod arrived in (the level demand called for, not the
// margin of a quiet node), and returns the updated history.
func (h History) Want(t time.Time, n int) History {
	if len(h.recent) == 0 || !h.recent[len(h.recent)-1].Truncate(h.span(time.Minute)).Equal(t.Truncate(h.span(time.Minute))) {
		return h
	}
	h = h.minute(t)
	last := &h.peaks[len(h.peaks)-1]
	last.want = max(last.want, n)
	return h
}

// Snapshot is a copy of h that stays unchanged while h goes on recording
// (Record only appends beyond the copy's arrivals; the minutes are copied),
// for handing to Next from another goroutine.
func (h History) Snapshot() History {
	h.peaks = slices.Clone(h.peaks)
	h.recent = h.recent[:len(h.recent):len(h.recent)]
	return h
}

// minute makes t's minute the last entry of peaks and drops the ones older
// than BurstMemory.
func (h History) minute(t time.Time) History {
	m := t.Truncate(h.span(time.Minute))
	if n := len(h.peaks); n == 0 || h.peaks[n-1].minute.Before(m) {
		h.peaks = append(h.peaks, peak{minute: m})
	}
	cut := 0
	for cut < len(h.peaks)-1 && t.Sub(h.peaks[cut].minute) > h.span(max(BurstMemory, WantMemory)) {
		cut++
	}
	h.peaks = h.peaks[cut:]
	if t.After(h.at) {
		h.at = t // callers may pass a time a little before the latest (a plan's now after an ADD's)
	}
	return h
}

// burstPeaks are the minutes within BurstMemory of the latest time
// recorded (at least the last minute): what every reckoning but
// wantAgain's looks back over, as when no more was kept.
func (h History) burstPeaks() []peak {
	p := h.peaks
	for len(p) > 1 && h.at.Sub(p[0].minute) > h.span(BurstMemory) {
		p = p[1:]
	}
	return p
}

// idleAhead is how long, from now, more than level addresses are expected
// to stay unneeded. idle is how long the memory saw no minute with more in
// use (since the last minute that did, or the oldest minute remembered;
// BurstMemory without any), at most since when since is above 0. If demand
// went above level and back more than once (a job every few minutes), the
// next rise is expected after the median of what the gaps between those
// episodes longer than idle have left (a jittered job past its median gap
// is due soon); with no gap longer than idle (a pattern broken, or none),
// as long again as idle.
func (h History) idleAhead(now time.Time, level int, since time.Duration) time.Duration {
	return h.idleAheadOf(now, level, since, func(p peak) int { return p.inUse })
}

// idleAheadWant is idleAhead with the minutes' wanted addresses (Want)
// in place of those in use: how long a pool of level addresses is
// expected to stay at least what the policy wants.
func (h History) idleAheadWant(now time.Time, level int, since time.Duration) time.Duration {
	return h.idleAheadOf(now, level, since, func(p peak) int { return p.want })
}

// idleAheadOf is idleAhead's reckoning over the minutes' figure of.
func (h History) idleAheadOf(now time.Time, level int, since time.Duration, of func(peak) int) time.Duration {
	idle := h.span(BurstMemory)
	peaks := h.burstPeaks()
	if len(peaks) > 0 {
		idle = max(now.Sub(peaks[0].minute), 0)
	}
	var gaps []time.Duration
	var last time.Time // end of the latest minute above level
	for _, p := range peaks {
		if of(p) <= level {
			continue
		}
		if !last.IsZero() && p.minute.After(last) {
			gaps = append(gaps, p.minute.Sub(last))
		}
		last = p.minute.Add(h.span(time.Minute))
	}
	if !last.IsZero() {
		idle = max(now.Sub(last), 0)
	}
	if since > 0 {
		idle = min(idle, since)
	}
	if len(gaps) == 0 {
		return idle
	}
	// Only the gaps longer than idle are what the present one can still
	// turn out to be.
	var left []time.Duration
	for _, g := range gaps {
		if g > idle {
			left = append(left, g-idle)
		}
	}
	if len(left) == 0 {
		return idle
	}
	slices.Sort(left)
	return left[len(left)/2]
}

// filling reports whether now is within d of the first arrival recorded
// (d in the history's time scale).
func (h History) filling(now time.Time, d time.Duration) bool {
	return h.seen && now.Sub(h.first) < h.span(d)
}

// within counts the arrivals in (now − d, now].
func (h History) within(now time.Time, d time.Duration) int {
	n := 0
	for i := len(h.recent) - 1; i >= 0; i-- {
		age := now.Sub(h.recent[i])
		if age >= d {
			break
		}
		if age >= 0 {
			n++
		}
	}
	return n
}

// peak is the most addresses in use observed within memory of now.
func (h History) peak(now time.Time, memory time.Duration) int {
	n := 0
	for _, p := range h.burstPeaks() {
		if now.Sub(p.minute) <= memory {
			n = max(n, p.inUse)
		}
	}
	return n
}

// wantAgain is the most addresses the pool wanted held (Want) in at least
// two separate episodes within memory of now, where an episode is a run of
// consecutive minutes wanting more than above: demand that came back, not
// a one-off peak. 0 when fewer than two episodes wanted more than above.
func (h History) wantAgain(now time.Time, memory time.Duration, above int) int {
	var tops []int // each episode's most wanted
	var prev time.Time
	for _, p := range h.peaks {
		if now.Sub(p.minute) > memory || p.want <= above {
			continue
		}
		if len(tops) > 0 && p.minute.Sub(prev) <= h.span(time.Minute) {
			tops[len(tops)-1] = max(tops[len(tops)-1], p.want)
		} else {
			tops = append(tops, p.want)
		}
		prev = p.minute
	}
	if len(tops) < 2 {
		return 0
	}
	slices.Sort(tops)
	return tops[len(tops)-2]
}

// before is the most in use in the minute that held t − 90 s (before a
// burst that t's growth served began); false if no pod arrived in it.
func (h History) before(t time.Time) (int, bool) {
	m := t.Add(-h.span(90 * time.Second)).Truncate(h.span(time.Minute))
	peaks := h.burstPeaks()
	for i := len(peaks) - 1; i >= 0; i-- {
		if peaks[i].minute.Equal(m) {
			return peaks[i].inUse, peaks[i].inUse > 0
		}
	}
	return 0, false
}

// bursts are the largest burst within memory of now and the typical
// one: the median of the minutes' largest bursts of BurstStart or more and
// at least a quarter of the largest (pairs of pods starting together do
// not hide the bursts of a job).
func (h History) bursts(now time.Time, memory time.Duration) (largest, typical int) {
	peaks := h.burstPeaks()
	for _, p := range peaks {
		if now.Sub(p.minute) <= memory {
			largest = max(largest, p.burst)
		}
	}
	var sizes []int
	for _, p := range peaks {
		if now.Sub(p.minute) <= memory && p.burst >= max(BurstStart, ceilDiv(largest, 4)) {
			sizes = append(sizes, p.burst)
		}
	}
	if len(sizes) == 0 {
		return largest, 0
	}
	slices.Sort(sizes)
	return largest, sizes[len(sizes)/2]
}
