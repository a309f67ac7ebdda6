package poolsim

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Pod is one pod of a trace: it is scheduled to the node at Arrive (from the
// trace's start) and runs for Life once it has its address.
type Pod struct {
	Arrive time.Duration
	Life   time.Duration
}

// Trace is a node's pod churn, sorted by arrival.
type Trace struct {
	Name     string
	Duration time.Duration
	Pods     []Pod
}

// Generator makes a trace for a node that runs at most capacity pods, from
// a seed.
type Generator struct {
	Name string
	Make func(rng *rand.Rand, capacity int) Trace
}

// TraceHours is the length of every trace.
const TraceHours = 6

// Generators are the traces of the table, each described where it is made.
var Generators = []Generator{
	{"steady", steady},
	{"rollout", rollout},
	{"batch", batch},
	{"cron", cron},
	{"fill", fill},
	{"drain", drain},
}

// Make returns the trace of a generator for a node of capacity pods.
func (g Generator) Trace(seed uint64, capacity int) Trace {
	rng := rand.New(rand.NewPCG(seed, uint64(capacity)))
	t := g.Make(rng, capacity)
	t.Name = g.Name
	t.Duration = TraceHours * time.Hour
	slices.SortStableFunc(t.Pods, func(a, b Pod) int { return int(a.Arrive - b.Arrive) })
	t.Pods = bound(t.Pods, capacity)
	return t
}

// bound drops the pods the scheduler would not bind to a node running
// capacity pods already (by the pods' nominal lives).
func bound(pods []Pod, capacity int) []Pod {
	var ends []time.Duration // of the bound pods still running, sorted
	out := pods[:0]
	for _, p := range pods {
		i := 0
		for i < len(ends) && ends[i] <= p.Arrive {
			i++
		}
		ends = ends[i:]
		if len(ends) >= capacity {
			continue
		}
		e := p.Arrive + p.Life
		j, _ := slices.BinarySearch(ends, e)
		ends = slices.Insert(ends, j, e)
		out = append(out, p)
	}
	return out
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// expo draws an exponential duration of the given mean.
func expo(rng *rand.Rand, mean time.Duration) time.Duration {
	return secs(rng.ExpFloat64() * mean.Seconds())
}

// uniform draws a duration in [lo, hi).
func uniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

const end = TraceHours * time.Hour

// base fills the node with n long-lived pods over the first ramp, each
// living until the end of the trace.
func base(rng *rand.Rand, n int, ramp time.Duration) []Pod {
	out := make([]Pod, 0, n)
	for range n {
		a := uniform(rng, 0, ramp)
		out = append(out, Pod{Arrive: a, Life: end - a})
	}
	return out
}

// poisson adds pods arriving as a Poisson process of rate perHour from
// start to stop, with lives drawn by life.
func poisson(rng *rand.Rand, perHour float64, start, stop time.Duration, life func() time.Duration) []Pod {
	var out []Pod
	if perHour <= 0 {
		return nil
	}
	for t := start + expo(rng, secs(3600/perHour)); t < stop; t += expo(rng, secs(3600/perHour)) {
		out = append(out, Pod{Arrive: t, Life: life()})
	}
	return out
}

// steady: a plateau of 60 % of capacity, filled over the first 10
// minutes. Pods are deleted as a Poisson process (each lives 30 minutes on
// average, exponentially) and their controllers replace each one 5–30 s
// later; a tenth of the replacements land on other nodes and as many pods
// of other nodes' churn arrive here (Poisson).
func steady(rng *rand.Rand, capacity int) Trace {
	plateau := int(math.Round(0.6 * float64(capacity)))
	mean := 30 * time.Minute
	var pods []Pod
	chain := func(at time.Duration) {
		for at < end {
			life := expo(rng, mean)
			pods = append(pods, Pod{Arrive: at, Life: life})
			at += life + uniform(rng, 5*time.Second, 30*time.Second)
			if rng.Float64() < 0.1 {
				return
			}
		}
	}
	for range plateau {
		chain(uniform(rng, 0, 10*time.Minute))
	}
	perHour := 0.1 * float64(plateau) * float64(time.Hour) / float64(mean)
	for _, p := range poisson(rng, perHour, 10*time.Minute, end, func() time.Duration { return expo(rng, mean) }) {
		chain(p.Arrive)
	}
	return Trace{Pods: pods}
}

// rollout: one Deployment holds half the capacity; every hour all its pods
// are replaced by a rolling update with maxSurge 25 %: a wave of a quarter
// of the replicas starts every 20 seconds and the old pods it replaces stop
// 15 seconds later (readiness). A tenth of the capacity is other
// long-lived pods.
func rollout(rng *rand.Rand, capacity int) Trace {
	replicas := capacity / 2
	pods := base(rng, capacity/10, 10*time.Minute)
	wave := (replicas + 3) / 4
	start := func(at time.Duration) []time.Duration {
		var out []time.Duration
		for i := range replicas {
			out = append(out, at+time.Duration(i/wave)*20*time.Second+uniform(rng, 0, 2*time.Second))
		}
		return out
	}
	gen := start(uniform(rng, time.Minute, 5*time.Minute))
	for h := time.Hour; ; h += time.Hour {
		var next []time.Duration
		if h < end {
			next = start(h + uniform(rng, 0, 10*time.Minute))
		}
		for i, a := range gen {
			stop := end
			if next != nil {
				stop = next[i] + 15*time.Second
			}
			pods = append(pods, Pod{Arrive: a, Life: max(stop-a, time.Second)})
		}
		if next == nil {
			break
		}
		gen = next
	}
	return Trace{Pods: pods}
}

// batch: a fifth of the capacity is long-lived; every 10–20 minutes a job
// starts a burst of 30–45 % of the capacity at once (within 2 seconds),
// each pod running 1–3 minutes.
func batch(rng *rand.Rand, capacity int) Trace {
	pods := base(rng, capacity/5, 10*time.Minute)
	for t := uniform(rng, 5*time.Minute, 15*time.Minute); t < end; t += uniform(rng, 10*time.Minute, 20*time.Minute) {
		n := int(float64(capacity) * (0.30 + 0.15*rng.Float64()))
		for range n {
			pods = append(pods, Pod{Arrive: t + uniform(rng, 0, 2*time.Second), Life: uniform(rng, time.Minute, 3*time.Minute)})
		}
	}
	return Trace{Pods: pods}
}

// cron: 40 % of the capacity is long-lived; CronJobs start very short pods
// on a schedule: every minute a tenth of the capacity (living 5–40 s),
// every five minutes another fifth (living 20–90 s); pods of one schedule
// start within 3 seconds.
func cron(rng *rand.Rand, capacity int) Trace {
	pods := base(rng, capacity*2/5, 10*time.Minute)
	for m := time.Minute; m < end; m += time.Minute {
		n := max(capacity/10, 1)
		lo, hi := 5*time.Second, 40*time.Second
		for range n {
			pods = append(pods, Pod{Arrive: m + uniform(rng, 0, 3*time.Second), Life: uniform(rng, lo, hi)})
		}
		if m%(5*time.Minute) == 0 {
			for range max(capacity/5, 1) {
				pods = append(pods, Pod{Arrive: m + uniform(rng, 0, 3*time.Second), Life: uniform(rng, 20*time.Second, 90*time.Second)})
			}
		}
	}
	return Trace{Pods: pods}
}

// fill: a new node joins a scaled-out cluster: 90 % of its capacity is
// scheduled to it, most within the first two minutes (arrival times
// exponential with a 40-second mean), and stays for the rest of the trace.
func fill(rng *rand.Rand, capacity int) Trace {
	n := capacity * 9 / 10
	var pods []Pod
	for range n {
		a := min(expo(rng, 40*time.Second), 10*time.Minute)
		pods = append(pods, Pod{Arrive: a, Life: end - a})
	}
	return Trace{Pods: pods}
}

// drain: a node runs 80 % of its capacity (filled over 10 minutes), is
// drained after two hours (its pods evicted within one minute) and stays
// empty, cordoned, for the rest of the trace.
func drain(rng *rand.Rand, capacity int) Trace {
	n := capacity * 4 / 5
	var pods []Pod
	for range n {
		a := uniform(rng, 0, 10*time.Minute)
		stop := 2*time.Hour + uniform(rng, 0, time.Minute)
		pods = append(pods, Pod{Arrive: a, Life: stop - a})
	}
	return Trace{Pods: pods}
}
