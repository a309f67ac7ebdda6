// Package poolsim replays pod churn traces against a node's warm pool on a
// virtual clock: six hours of a node in a fraction of a second. It runs the
// pool code production runs (package ipamd's pool component and datastore,
// with warmpool's policy) and, side by side, the reference algorithm of
// package reference, both against the same in-memory cloud (Cloud, a
// provider.Provider with EC2's latencies and limits), with kubelet's CNI ADD
// retry behaviour, and measures what a warm pool trades: idle
// address-hours, pods that waited for an address, and EC2 mutating calls.
//
// Concurrency: the simulation is one event loop (Clock). Pool loops run on
// their own goroutines, as in the daemon, but only one goroutine runs at a
// time: a cloud call parks its goroutine on the Clock until the virtual time
// of its completion, and pod events run meanwhile. Runs are deterministic
// for a seed.
package poolsim

import (
	"container/heap"
	"time"
)

// Epoch is the virtual clock's start.
var Epoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

// Clock is the virtual clock and event queue of one simulated node. Its
// methods are called from the event loop or from a goroutine the loop is
// waiting for (Go); never from two goroutines at once.
type Clock struct {
	now    time.Time
	q      events
	seq    uint64
	parked chan park
	// Settled, when set, runs on the event loop each time a goroutine
	// started by Go parks or finishes: the state it changed is then
	// visible (the daemon's waiting ADDs look again at that point).
	Settled func()
}

type park struct {
	at   time.Time
	wake chan struct{}
}

type event struct {
	at  time.Time
	seq uint64 // ties run in scheduling order
	fn  func()
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if !e[i].at.Equal(e[j].at) {
		return e[i].at.Before(e[j].at)
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// NewClock returns a clock at Epoch.
func NewClock() *Clock { return &Clock{now: Epoch, parked: make(chan park)} }

// Now is the virtual time.
func (c *Clock) Now() time.Time { return c.now }

// At schedules fn at t (at once if t is past), after the events already due
// then.
func (c *Clock) At(t time.Time, fn func()) {
	if t.Before(c.now) {
		t = c.now
	}
	c.seq++
	heap.Push(&c.q, event{at: t, seq: c.seq, fn: fn})
}

// After schedules fn d from now.
func (c *Clock) After(d time.Duration, fn func()) { c.At(c.now.Add(d), fn) }

// Run processes events until the queue is empty or the next one is after
// end; the clock then stands at end.
func (c *Clock) Run(end time.Time) {
	for c.q.Len() > 0 && !c.q[0].at.After(end) {
		e := heap.Pop(&c.q).(event)
		c.now = e.at
		e.fn()
	}
	c.now = end
}

// RunWhile processes events while cond holds and events remain.
func (c *Clock) RunWhile(cond func() bool) {
	for cond() && c.q.Len() > 0 {
		e := heap.Pop(&c.q).(event)
		c.now = e.at
		e.fn()
	}
}

// Go runs fn on a goroutine of its own, as the daemon runs its pool loop,
// and returns once fn has finished or parked in Sleep. A parked fn resumes
// from an event at its wake-up time; the loop waits for it again then.
func (c *Clock) Go(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	c.await(done)
}

func (c *Clock) await(done chan struct{}) {
	select {
	case p := <-c.parked:
		c.At(p.at, func() {
			close(p.wake)
			c.await(done)
		})
	case <-done:
	}
	if c.Settled != nil {
		c.Settled()
	}
}

// Sleep blocks the calling goroutine, which must have been started by Go,
// for d of virtual time; events due meanwhile run.
func (c *Clock) Sleep(d time.Duration) {
	p := park{at: c.now.Add(max(d, 0)), wake: make(chan struct{})}
	c.parked <- p
	<-p.wake
}
