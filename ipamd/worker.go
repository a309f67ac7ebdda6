package ipamd

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/pool"
)

// worker is the goroutine that owns every cloud call: it runs start-up, then
// pool cycles (timer and kicks), reconciliation, the EC2 resync and the
// leaked-ENI sweep, the release of addresses whose pods the Kubernetes part
// found gone, one at a time, and publishes the status after each.
type worker struct {
	cfg     config.Config
	pool    *pool.Pool
	rec     *reconciler
	gone    *goneReleaser
	publish func() // after every pass

	kick    chan struct{}   // capacity 1: a pool cycle is wanted
	calls   chan workerCall // functions to run on the worker (tests, tooling)
	changed <-chan struct{} // PodFacts.Changed; nil: no Kubernetes part
	wake    <-chan struct{} // Options.Wake; nil: none
}

// newWorker wires the worker; changed and wake may be nil (never ready).
func newWorker(cfg config.Config, p *pool.Pool, rec *reconciler, gone *goneReleaser, changed, wake <-chan struct{}, publish func()) *worker {
	return &worker{cfg: cfg, pool: p, rec: rec, gone: gone, publish: publish, kick: make(chan struct{}, 1), calls: make(chan workerCall),
		changed: changed, wake: wake}
}

// Kick asks the worker for a pool cycle soon; calls fold into one.
func (w *worker) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run is the worker goroutine. It returns the error start-up gave up with
// for good (reconciler.fatal), nil otherwise.
func (w *worker) run(ctx context.Context, restored restoreOutcome) error {
	// The status sink hears of the daemon while start-up still waits for
	// the cloud (not ready, and why), as it did when the Kubernetes part
	// polled the daemon.
	w.publish()
	if !w.rec.start(ctx, restored) {
		w.publish()
		return w.rec.fatal
	}
	w.publish()
	w.loop(ctx)
	return nil
}

// cycle is a pool cycle, and the time until the next one. In IPv6 mode the
// node's one /80 needs no pool (see ipv6.go): no cycle, no EC2 call.
func (w *worker) cycle(ctx context.Context) time.Duration {
	if w.cfg.IPv6 {
		return w.cfg.PoolInterval
	}
	return w.pool.Cycle(ctx)
}

// loop runs pool cycles (timer and kicks), reconciliation, the EC2 resync
// and the leaked-ENI sweep until ctx ends.
func (w *worker) loop(ctx context.Context) {
	next := time.NewTimer(0)
	defer next.Stop()
	reconcile := time.NewTicker(jitter(w.cfg.ReconcileInterval))
	defer reconcile.Stop()
	resync := time.NewTicker(jitter(w.cfg.ResyncInterval))
	defer resync.Stop()
	sweep := time.NewTimer(jitter(w.cfg.LeakSweepInterval)) // not at start: one Describe per node at start (B08)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-w.wake:
		case <-next.C:
		case <-w.changed:
			w.gone.run()
		case <-reconcile.C:
			w.rec.reconcile(ctx, false)
			w.gone.run()
		case <-resync.C:
			if !w.cfg.IPv6 { // IPv6: the /80 never changes; periodic reconciliation still asks IMDS
				w.rec.reconcile(ctx, true)
			}
		case <-sweep.C:
			if !w.cfg.IPv6 { // IPv6: this node creates no ENI, so leaks none
				w.rec.sweepLeaked(ctx)
			}
			sweep.Reset(jitter(w.cfg.LeakSweepInterval))
		case req := <-w.calls:
			if req.fn != nil {
				req.fn(ctx)
			}
			next.Reset(w.cycle(ctx))
			w.publish()
			close(req.done)
			continue
		}
		next.Reset(w.cycle(ctx))
		w.publish()
	}
}

// workerCall is a function run on the worker goroutine, followed by a pool
// cycle; done is closed after both.
type workerCall struct {
	fn   func(context.Context)
	done chan struct{}
}

// onWorker runs fn (may be nil) and then a pool cycle on the worker
// goroutine, keeping every cloud call there, and waits for both. It returns
// false if ctx ends first or the worker is not running.
func (w *worker) onWorker(ctx context.Context, fn func(context.Context)) bool {
	req := workerCall{fn: fn, done: make(chan struct{})}
	select {
	case w.calls <- req:
	case <-ctx.Done():
		return false
	}
	select {
	case <-req.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitter spreads d over [0.75d, 1.25d) so daemons started together do not
// call the cloud in lock-step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}
