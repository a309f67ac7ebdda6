package ipamd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"golang.org/x/sync/errgroup"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/ipamd/pool"
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
	// Pods are the facts the Kubernetes part supplies: the pool's demand
	// (pods bound here without an address), the pods gone from the API
	// server whose addresses the host-check path releases, and a change
	// signal that wakes the worker. nil: none.
	Pods PodFacts
	// Status receives the node's Snapshot after every worker pass (the
	// Kubernetes part publishes it). nil: none.
	Status StatusSink
	// Wake asks for a pool cycle soon when it receives (the ENIConfig
	// reader's: the node's ENIConfig appeared or changed). nil: none.
	Wake <-chan struct{}
	// Placement is the latest decision of where a new ENI goes
	// (podsubnet.Placer.Last): status, introspection and the Kubernetes
	// part show it, and ADD refusals name its Problem (a missing or invalid
	// ENIConfig, no eligible subnet). nil: nothing to show.
	Placement func() podsubnet.Decision
	// Events records, on the pod, why its ADD got no address (the
	// Kubernetes part). It must not block. nil: none.
	Events NoAddressRecorder
	// Kubernetes reports the Kubernetes part's state for introspection and
	// `vpcipctl status`. nil: shown as disabled.
	Kubernetes func() introspect.Kubernetes
	// MetricsGuard, when set, serves the metrics listener over TLS only
	// and lets a request reach /metrics only when the guard allows it
	// (package ipamd/metricsauth: the scraper's token reviewed by the API
	// server; VPCIP_METRICS_SECURE). nil: plain HTTP, unauthenticated.
	MetricsGuard MetricsGuard
	// NetnsDirs are the directories the runtime mounts sandboxes' netns in,
	// as this process sees them: the witness that a pod went without a DEL
	// (see netnsWitness). nil: DefaultNetnsDirs.
	NetnsDirs []string
}

// MetricsGuard secures the metrics listener: its TLS configuration, and
// the check every request passes before the handler.
type MetricsGuard interface {
	TLSConfig() *tls.Config
	Wrap(http.Handler) http.Handler
}

// NoAddressRecorder is told about every ADD answered without an address,
// with the error (cause and numbers) the plugin returns.
type NoAddressRecorder interface {
	NoAddress(pod api.Pod, e *api.Error)
}

// Daemon is vpcipd: the wiring of its parts (see the package comment). Use
// New, then Run.
type Daemon struct {
	cfg      config.Config
	log      *slog.Logger
	gatherer prometheus.Gatherer
	guard    MetricsGuard
	store    *datastore.Store

	life  *lifecycle
	ckpt  *checkpointer
	node  *nodeInfo
	hosts *hostSync
	pool  *pool.Pool
	rec   *reconciler
	work  *worker
	api   *apiServer
	view  *statusView
	flush *conntrackFlusher
}

// New wires a daemon. It does no I/O.
func New(o Options) (*Daemon, error) {
	if o.Provider == nil {
		return nil, errors.New("ipamd: Options.Provider is required")
	}
	o = withDefaults(o)
	cfg, store := o.Config, datastore.New(o.Config.Cooldown)
	store.SetMaxAssigned(cfg.MaxPods)
	store.Conntrack().SetFlushing(true)
	d := &Daemon{cfg: cfg, log: o.Logger, gatherer: o.Gatherer, guard: o.MetricsGuard, store: store, life: newLifecycle(), node: &nodeInfo{}}
	d.ckpt = &checkpointer{path: cfg.Checkpoint, store: store, log: o.Logger, metrics: o.Metrics, now: o.Clock}
	d.hosts = newHostSync(o.Host, cfg, store, o.Logger, o.Metrics, o.Clock, o.NetnsDirs)
	d.hosts.imds = newPodIMDS(o.Host, cfg, store, o.Logger)
	d.rec = &reconciler{cfg: cfg, prov: o.Provider, store: store, node: d.node, hosts: d.hosts, ckpt: d.ckpt,
		life: d.life, log: o.Logger, metrics: o.Metrics, now: o.Clock, missing: map[string]int{}}
	d.flush = &conntrackFlusher{host: o.Host, store: store, log: o.Logger, now: o.Clock}
	d.api = &apiServer{cfg: cfg, store: store, node: d.node, ckpt: d.ckpt, life: d.life, log: o.Logger,
		metrics: o.Metrics, now: o.Clock, placement: o.Placement, events: o.Events, flush: d.flush, imds: d.hosts.imds}
	if d.api.placement == nil {
		d.api.placement = func() podsubnet.Decision { return podsubnet.Decision{} }
	}
	var demand pool.Demand
	if o.Pods != nil {
		demand = podDemand{facts: o.Pods, store: store}
	}
	p, err := pool.New(pool.Options{
		Store: store, Provider: o.Provider, Node: d.node, Config: poolConfig(cfg), Interval: cfg.PoolInterval,
		Clock: o.Clock, Logger: o.Logger, Pending: d.api, Demand: demand, Host: d.hosts, PrimaryHoldsNoPods: cfg.CustomNetworking,
		Resync: d.rec.resync, Persist: d.ckpt.persist, Stopping: d.life.stopping.Load,
		Observe: func(action, outcome string) { o.Metrics.actions.WithLabelValues(action, outcome).Inc() },
	})
	if err != nil {
		return nil, err
	}
	d.pool, d.api.pool = p, p
	d.view = &statusView{cfg: cfg, store: store, node: d.node, pool: p, hosts: d.hosts, life: d.life, placement: d.api.placement, ckpt: d.ckpt,
		now: o.Clock, version: o.Version, started: o.Clock(), kube: o.Kubernetes}
	d.api.view = d.view
	gone := &goneReleaser{facts: o.Pods, hosts: d.hosts, store: store, log: o.Logger, metrics: o.Metrics, now: o.Clock}
	var changed <-chan struct{}
	if o.Pods != nil {
		changed = o.Pods.Changed()
	}
	d.work = newWorker(cfg, p, d.rec, gone, changed, o.Wake, func() {
		if o.Status != nil {
			o.Status.PublishStatus(d.view.published())
		}
	})
	d.api.kick = d.work.Kick
	if err := o.Metrics.reg.Register(newPoolCollector(d.view.status)); err != nil {
		return nil, fmt.Errorf("ipamd: register pool metrics: %w", err)
	}
	return d, nil
}

// withDefaults fills the optional Options.
func withDefaults(o Options) Options {
	if o.Host == nil {
		o.Host = NoHost{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Metrics == nil {
		reg := prometheus.NewRegistry()
		o.Metrics = NewMetrics(reg)
		if o.Gatherer == nil {
			o.Gatherer = reg
		}
	}
	return o
}

// poolConfig is the warm-pool policy's part of the configuration.
func poolConfig(c config.Config) warmpool.Config {
	return warmpool.Config{
		WarmENITarget: c.WarmENITarget, WarmIPTarget: c.WarmIPTarget,
		MinimumIPTarget: c.MinimumIPTarget, WarmPrefixTarget: c.WarmPrefixTarget,
		PrefixDelegation: c.PrefixDelegation, ReleaseInterval: c.ReleaseInterval,
		ENIMinAge: c.ENIMinAge, Adaptive: c.AdaptivePool(),
	}
}

// Kick asks the worker for a pool cycle soon; calls fold into one.
func (d *Daemon) Kick() { d.work.Kick() }

// Ready returns a channel closed once the daemon can assign addresses.
func (d *Daemon) Ready() <-chan struct{} { return d.life.ready }

// Status reports readiness and the pool's numbers (the plugin API's status).
func (d *Daemon) Status() api.Status { return d.view.status() }

// Snapshot is the node's status now, without Held (see StatusSink).
func (d *Daemon) Snapshot() nodestatus.Snapshot { return d.view.snapshot() }

// State is the introspection view (package introspect).
func (d *Daemon) State() introspect.State { return d.view.state() }

// Assign answers an address request (CNI ADD); see apiServer.Assign.
func (d *Daemon) Assign(ctx context.Context, req api.AssignRequest) (api.Assignment, error) {
	return d.api.Assign(ctx, req)
}

// Release gives a key's address back (CNI DEL); see apiServer.Release.
func (d *Daemon) Release(req api.ReleaseRequest) (api.ReleaseResponse, error) {
	return d.api.Release(req)
}

// Check returns a key's assignment (CNI CHECK); see apiServer.Check.
func (d *Daemon) Check(req api.CheckRequest) (api.Assignment, error) { return d.api.Check(req) }

// GC releases stale assignments (CNI GC); see apiServer.GC.
func (d *Daemon) GC(req api.GCRequest) (api.GCResponse, error) { return d.api.GC(req) }

// Run serves until ctx ends. It returns an error only for what stops the
// daemon from working at all (socket, checkpoint lock, listener addresses).
func (d *Daemon) Run(ctx context.Context) error {
	unlock, err := lockCheckpoint(d.cfg.Checkpoint)
	if err != nil {
		return err
	}
	defer unlock()
	restored, err := d.ckpt.load()
	if err != nil {
		return err
	}
	servers, listeners, err := d.listen()
	if err != nil {
		return err
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
		return d.work.run(gctx, restored)
	})
	g.Go(func() error {
		d.flush.run(gctx)
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		d.shutdown(servers)
		return nil
	})
	err = g.Wait()
	// The worker may have recorded a last change after the servers stopped.
	if perr := d.ckpt.persist(); perr != nil {
		d.log.Error("final checkpoint write failed", "err", perr)
	}
	os.Remove(d.cfg.Socket)
	return err
}

// sideLimits bound what a client of the metrics and introspection
// listeners can hold. Metrics listen on every node address by default and
// any pod reaches them: without a read and an idle timeout, one pod could
// keep tens of thousands of connections open against a node-critical
// daemon that has no memory limit. A scrape takes milliseconds; Prometheus
// keeps one connection per target and reconnects at will. 256 connections
// hold about 2.5 MB (a goroutine and a 4 KiB read buffer each); a client
// that leaves keep-alive connections behind loses them after 10 s idle.
var sideLimits = struct {
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int // bytes
	MaxConns                      int // connections open at once per listener; more wait in the kernel's backlog
}{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: 30 * time.Second, Idle: 10 * time.Second,
	MaxHeaderBytes: 16 << 10, MaxConns: 256}

// listen opens the plugin API socket and the metrics and introspection
// listeners, with a server for each.
func (d *Daemon) listen() ([]*http.Server, []net.Listener, error) {
	sock, err := listenSocket(d.cfg.Socket)
	if err != nil {
		return nil, nil, err
	}
	servers := []*http.Server{{Handler: d.api.handler(), ReadHeaderTimeout: 5 * time.Second}}
	listeners := []net.Listener{sock}
	for _, s := range d.sideServers() {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			closeAll(listeners)
			return nil, nil, fmt.Errorf("listen %s on %s: %w", s.name, s.addr, err)
		}
		lim := sideLimits
		ln, scheme := netutil.LimitListener(ln, lim.MaxConns), "http"
		if s.tls != nil {
			// Outside the limit, so the server sees *tls.Conn: it then
			// bounds the handshake by its read timeout and answers plain
			// HTTP with 400.
			ln, scheme = tls.NewListener(ln, s.tls), "https"
		}
		d.log.Info("serving", "what", s.name, "addr", ln.Addr().String(), "scheme", scheme)
		servers = append(servers, &http.Server{Handler: s.handler, ReadHeaderTimeout: lim.ReadHeader, ReadTimeout: lim.Read,
			WriteTimeout: lim.Write, IdleTimeout: lim.Idle, MaxHeaderBytes: lim.MaxHeaderBytes})
		listeners = append(listeners, ln)
	}
	return servers, listeners, nil
}

// shutdown stops cloud changes, lets in-flight requests finish (up to 10 s)
// and writes the checkpoint one last time.
func (d *Daemon) shutdown(servers []*http.Server) {
	d.life.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			d.log.Warn("shutdown: requests still in flight", "err", err)
			_ = s.Close() // drop what is still in flight; nothing more to do on failure
		}
	}
	if err := d.ckpt.persist(); err != nil {
		d.log.Error("shutdown: checkpoint write failed", "err", err)
	}
	d.log.Info("vpcipd stopped serving")
}

type sideServer struct {
	name, addr string
	handler    http.Handler
	tls        *tls.Config // nil: plain HTTP
}

func (d *Daemon) sideServers() []sideServer {
	var out []sideServer
	if d.cfg.MetricsAddr != "" && d.gatherer != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.gatherer, promhttp.HandlerOpts{}))
		s := sideServer{name: "metrics", addr: d.cfg.MetricsAddr, handler: mux}
		if d.guard != nil {
			s.handler, s.tls = d.guard.Wrap(mux), d.guard.TLSConfig()
		}
		out = append(out, s)
	}
	if d.cfg.IntrospectionAddr != "" {
		out = append(out, sideServer{name: "introspection", addr: d.cfg.IntrospectionAddr, handler: introspect.Handler(d.view.state)})
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
