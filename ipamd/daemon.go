// Package ipamd is vpcipd, the node daemon: it keeps the node's warm pool of
// VPC addresses on ENIs, hands them to pods over the plugin API (package api,
// HTTP/JSON on a unix socket), persists every assignment in a checkpoint, and
// reconciles its view with the cloud and the host.
//
// Goroutines and what they own:
//   - the worker: every cloud call. It restores state at start (checkpoint,
//     then EC2, then host routes), then loops: pool cycles (snapshot →
//     warmpool.Next → provider → hostnet → datastore → checkpoint), woken by a
//     timer and by a capacity-1 kick channel; reconciliation against instance
//     metadata, confirmed by EC2; the leaked-ENI sweep. It never holds the
//     datastore lock across a cloud call.
//   - the socket server: assign, release, check, GC, status, touching only
//     the datastore (under its mutex) and the checkpoint; an ADD that finds
//     the pool empty kicks the worker and waits a bounded time.
//   - the metrics and introspection HTTP servers, read-only.
//
// EC2 calls at idle (B08): reconciliation runs every VPCIP_RECONCILE_INTERVAL
// (60 s) and reads instance metadata only, calling EC2 DescribeNetworkInterfaces
// only when metadata disagrees with the datastore; an authoritative EC2 re-read
// runs every VPCIP_RESYNC_INTERVAL (5 m) and the leaked-ENI sweep every
// VPCIP_LEAK_SWEEP_INTERVAL (5 m), each jittered ±25 %. An idle node therefore
// makes at most 2 EC2 calls per 5 minutes. Start-up makes one batched Describe.
// Cloud refusals back off exponentially with jitter, per kind.
//
// Shrinking (B09): surplus is given back at most once per
// VPCIP_RELEASE_INTERVAL (30 s), one release of free addresses or one ENI
// deletion at a time, only under WARM_IP_TARGET/MINIMUM_IP_TARGET or surplus
// whole ENIs; after a burst that left k surplus ENIs the pool is at target
// within k+1 intervals once the released addresses are out of cooldown.
//
// New wires and does no I/O; Run works until its context ends, then stops
// making cloud changes, finishes in-flight requests and writes the checkpoint.
package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// Options are the daemon's dependencies.
type Options struct {
	Config   config.Config
	Provider provider.Provider
	Host     Host                // nil: NoHost
	Logger   *slog.Logger        // nil: discard
	Metrics  *Metrics            // nil: registered on a private registry
	Gatherer prometheus.Gatherer // served on MetricsAddr; nil: the private registry, or nothing
	Clock    func() time.Time    // nil: time.Now
	Version  string              // shown by introspection
}

// Daemon is vpcipd. Use New, then Run.
type Daemon struct {
	cfg      config.Config
	prov     provider.Provider
	host     Host
	log      *slog.Logger
	metrics  *Metrics
	gatherer prometheus.Gatherer
	now      func() time.Time
	version  string
	started  time.Time
	store    *datastore.Store

	kick    chan struct{}   // capacity 1: a pool cycle is wanted
	calls   chan workerCall // functions to run on the worker (tests, tooling)
	pending atomic.Int64    // ADDs waiting for an address
	ready   chan struct{}   // closed once state is restored and first reconciled
	readyOK atomic.Bool
	// stopping: shutdown began; no new cloud changes.
	stopping atomic.Bool
	closing  chan struct{} // closed when shutdown begins: waiting ADDs answer at once

	mu           sync.Mutex // guards the fields below
	self         provider.Instance
	limits       warmpool.Limits
	reason       string // why not ready, or a degradation
	refusals     []warmpool.Refusal
	strikes      map[warmpool.RefusalKind]int // consecutive refusals, for backoff
	lastRelease  time.Time
	links        map[string]string // ENI id → host link name
	hostErrs     map[string]string // ENI id → last EnsureENI failure
	noRoute      map[api.Key]int   // consecutive reconciles an assignment had no host route
	missing      map[string]int    // consecutive EC2 reads that lacked an ENI the datastore has
	restoredFrom string            // instance id recorded in the loaded checkpoint

	persistMu sync.Mutex // serializes checkpoint writes; guards savedGen
	savedGen  uint64
	instance  atomic.Value // string: instance id for the checkpoint
}

// New wires a daemon. It does no I/O.
func New(o Options) (*Daemon, error) {
	if o.Provider == nil {
		return nil, errors.New("ipamd: Options.Provider is required")
	}
	d := &Daemon{
		cfg: o.Config, prov: o.Provider, host: o.Host, log: o.Logger, metrics: o.Metrics,
		gatherer: o.Gatherer, now: o.Clock, version: o.Version,
		store:    datastore.New(o.Config.Cooldown),
		kick:     make(chan struct{}, 1),
		calls:    make(chan workerCall),
		ready:    make(chan struct{}),
		closing:  make(chan struct{}),
		strikes:  map[warmpool.RefusalKind]int{},
		links:    map[string]string{},
		hostErrs: map[string]string{},
		noRoute:  map[api.Key]int{},
		missing:  map[string]int{},
		reason:   "restoring state",
	}
	d.store.SetMaxAssigned(o.Config.MaxPods)
	if d.host == nil {
		d.host = NoHost{}
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.metrics == nil {
		reg := prometheus.NewRegistry()
		d.metrics = NewMetrics(reg)
		if d.gatherer == nil {
			d.gatherer = reg
		}
	}
	if err := d.metrics.reg.Register(newPoolCollector(d)); err != nil {
		return nil, fmt.Errorf("ipamd: register pool metrics: %w", err)
	}
	d.started = d.now()
	d.instance.Store("")
	return d, nil
}

// Kick asks the worker for a pool cycle soon; calls fold into one.
func (d *Daemon) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Ready returns a channel closed once the daemon can assign addresses.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// Run serves until ctx ends. It returns an error only for what stops the
// daemon from working at all (socket, checkpoint lock, listener addresses).
func (d *Daemon) Run(ctx context.Context) error {
	unlock, err := lockCheckpoint(d.cfg.Checkpoint)
	if err != nil {
		return err
	}
	defer unlock()
	restored, err := d.loadCheckpoint()
	if err != nil {
		return err
	}
	sock, err := listenSocket(d.cfg.Socket)
	if err != nil {
		return err
	}
	servers := []*http.Server{{Handler: d.apiHandler(), ReadHeaderTimeout: 5 * time.Second}}
	listeners := []net.Listener{sock}
	for _, s := range d.sideServers() {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			closeAll(listeners)
			return fmt.Errorf("listen %s on %s: %w", s.name, s.addr, err)
		}
		d.log.Info("serving", "what", s.name, "addr", ln.Addr().String())
		servers = append(servers, &http.Server{Handler: s.handler, ReadHeaderTimeout: 5 * time.Second})
		listeners = append(listeners, ln)
	}
	d.log.Info("vpcipd starting", "socket", d.cfg.Socket, "checkpoint", d.cfg.Checkpoint, "config", d.cfg.Map())
	for _, n := range d.cfg.Notes() {
		d.log.Warn("configuration note", "note", n)
	}

	g, gctx := errgroup.WithContext(ctx)
	for i, s := range servers {
		g.Go(func() error {
			if err := s.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", listeners[i].Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		d.work(gctx, restored)
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		d.shutdown(servers)
		return nil
	})
	err = g.Wait()
	// The worker may have recorded a last change after the servers stopped.
	if perr := d.persist(); perr != nil {
		d.log.Error("final checkpoint write failed", "err", perr)
	}
	os.Remove(d.cfg.Socket)
	return err
}

// shutdown stops cloud changes, lets in-flight requests finish (up to 10 s)
// and writes the checkpoint one last time.
func (d *Daemon) shutdown(servers []*http.Server) {
	d.stopping.Store(true)
	close(d.closing)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			d.log.Warn("shutdown: requests still in flight", "err", err)
			s.Close()
		}
	}
	if err := d.persist(); err != nil {
		d.log.Error("shutdown: checkpoint write failed", "err", err)
	}
	d.log.Info("vpcipd stopped serving")
}

type sideServer struct {
	name, addr string
	handler    http.Handler
}

func (d *Daemon) sideServers() []sideServer {
	var out []sideServer
	if d.cfg.MetricsAddr != "" && d.gatherer != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.gatherer, promhttp.HandlerOpts{}))
		out = append(out, sideServer{"metrics", d.cfg.MetricsAddr, mux})
	}
	if d.cfg.IntrospectionAddr != "" {
		out = append(out, sideServer{"introspection", d.cfg.IntrospectionAddr, introspect.Handler(d.State)})
	}
	return out
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		l.Close()
	}
}

// listenSocket opens the plugin API socket with mode 0600, removing a stale
// socket file a crashed daemon left (after checking nobody answers on it).
func listenSocket(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket path %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another daemon answers on %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	return ln, nil
}

// lockCheckpoint takes an exclusive flock on "<checkpoint>.lock", so two
// daemons never share a checkpoint. A lock file left by a dead process does not
// block: the kernel drops flocks with their holder.
func lockCheckpoint(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	f, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("checkpoint lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint %s is locked by another vpcipd: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// setReady marks the daemon ready (or not, with a reason).
func (d *Daemon) setReady(ok bool, reason string) {
	d.mu.Lock()
	d.reason = reason
	d.mu.Unlock()
	if ok && d.readyOK.CompareAndSwap(false, true) {
		close(d.ready)
	}
}
