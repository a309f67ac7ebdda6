package ipamd

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/ipamd/pool"
	"github.com/vpcip/vpcip/routing"
	"github.com/vpcip/vpcip/warmpool"
)

// waitPoll is how often a waiting ADD looks again, to catch addresses whose
// cooldown ran out (which no event announces).
const waitPoll = 100 * time.Millisecond

// apiServer answers the plugin API (assign, release, check, GC, status) on
// the socket server's goroutines. It touches the datastore (under the
// datastore's lock) and the checkpoint, never the cloud: an ADD that finds
// the pool empty kicks the worker and waits a bounded time. Its only state
// is the count of waiting ADDs, which the pool reads as demand.
type apiServer struct {
	cfg     config.Config
	store   *datastore.Store
	node    *nodeInfo
	pool    *pool.Pool
	ckpt    *checkpointer
	life    *lifecycle
	view    *statusView
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time
	kick    func()
	// placement is the latest ENI placement decision (Options.Placement).
	placement func() podsubnet.Decision
	events    NoAddressRecorder // nil: none
	flush     *conntrackFlusher
	imds      *podIMDS

	waiting atomic.Int64 // ADDs waiting for an address

	keys keyLocks // one ADD of an attachment at a time (Assign)
}

// keyLocks serializes the ADDs of one attachment key: an ADD whose caller
// gave up undoes its assignment after persisting it, and a repeated ADD of
// the key (the runtime's retry) answered the same address meanwhile would
// be left with an address the daemon no longer holds for it. Other keys
// never wait on each other. The zero value is ready.
type keyLocks struct {
	mu    sync.Mutex
	locks map[api.Key]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int // holders and waiters; the entry goes with the last
}

// lock takes key's lock and returns its unlock.
func (k *keyLocks) lock(key api.Key) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[api.Key]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

var _ pool.Demand = (*apiServer)(nil)

// Demand implements pool.Demand: ADDs waiting for an address now.
func (s *apiServer) Demand() int { return int(s.waiting.Load()) }

// Assign answers an address request (CNI ADD). A key that holds an address
// gets it again. Otherwise it takes a free address, records it in the
// checkpoint before answering, and kicks the pool loop to refill. When the
// pool is empty it kicks the loop and waits up to VPCIP_ADD_WAIT for an
// address, then answers CodeNoAddress with the cause. Before the daemon is
// ready (checkpoint loaded and first reconcile done) it waits the same bound,
// then answers CodeNotReady. It waits no later than req.Deadline, and an
// address it would hand out after that, or once the caller has gone (ctx
// done: the plugin gave up, e.g. while the daemon was stopped or slow), is
// not assigned: nothing would hold it, and the runtime's DEL may already
// have come and gone. The caller then gets CodeNotReady, if still there.
func (s *apiServer) Assign(ctx context.Context, req api.AssignRequest) (api.Assignment, error) {
	start := time.Now()
	defer func() { s.metrics.addWait.Observe(time.Since(start).Seconds()) }()
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AddWait)
	defer cancel()
	flushCtx := ctx // a reused address's flush is not cut short by the deadline
	if !req.Deadline.IsZero() {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, req.Deadline)
		defer cancelDeadline()
	}
	if err := callerGone(caller, req.Deadline); err != nil {
		return api.Assignment{}, s.abandoned(req, err, netip.Addr{})
	}
	defer s.keys.lock(req.Key)()
	select {
	case <-s.life.ready:
	case <-s.life.closing:
		return api.Assignment{}, &api.Error{Code: api.CodeNotReady, Message: "vpcipd is shutting down"}
	case <-ctx.Done():
		if err := callerGone(caller, time.Time{}); err != nil {
			return api.Assignment{}, s.abandoned(req, err, netip.Addr{})
		}
		// At req.Deadline the plugin is still there for a while
		// (Client.Assign's margin): tell it why.
		s.metrics.noAddress.WithLabelValues("not-ready").Inc()
		return api.Assignment{}, &api.Error{Code: api.CodeNotReady, Message: "vpcipd is not ready: " + s.view.status().Reason}
	}
	if _, held := s.store.Get(req.Key); !held {
		s.pool.Arrived(s.now())
	}
	waiting := false
	defer func() {
		if waiting {
			s.waiting.Add(-1)
		}
	}()
	var tick *time.Ticker
	for {
		if err := callerGone(caller, req.Deadline); err != nil {
			return api.Assignment{}, s.abandoned(req, err, netip.Addr{})
		}
		changed := s.store.Changed()
		a, existing, err := s.store.AssignIn(req.Key, req.Pod, req.Netns, s.now())
		if err == nil {
			if !existing {
				if perr := s.ckpt.persist(); perr != nil {
					s.store.Unassign(req.Key)
					return api.Assignment{}, &api.Error{Code: api.CodeInternal,
						Message: fmt.Sprintf("vpcipd: cannot record the assignment of %s in the checkpoint: %v", a.Address, perr)}
				}
				if err := callerGone(caller, req.Deadline); err != nil {
					s.store.Unassign(req.Key)
					if perr := s.ckpt.persist(); perr != nil {
						s.log.Error("checkpoint write after undoing an abandoned assignment failed; the next write records it", "key", req.Key.String(), "address", a.Address, "err", perr)
					}
					return api.Assignment{}, s.abandoned(req, err, a.Address)
				}
				s.log.Debug("assigned", "key", req.Key.String(), "pod", req.Pod.Namespace+"/"+req.Pod.Name, "address", a.Address, "eni", a.ENIID)
			}
			if a.Unflushed {
				s.flushBeforeUse(flushCtx, a)
			}
			// Before the answer: an allowed pod's rule exists before its
			// sandbox runs, and no rule of an earlier holder outlives it.
			s.imds.syncLogged(false)
			s.kick()
			return s.wire(a), nil
		}
		if e, final := s.noAddress(s.now()); final {
			return api.Assignment{}, s.refused(req, e)
		}
		if !waiting {
			waiting = true
			s.waiting.Add(1)
			tick = time.NewTicker(waitPoll)
			defer tick.Stop()
		}
		s.kick()
		select {
		case <-changed:
		case <-tick.C:
		case <-s.life.closing:
			return api.Assignment{}, s.refused(req, &api.Error{Code: api.CodeNotReady, Cause: api.CauseWaitingCloud,
				Message: "vpcipd is shutting down: no address now, try again"})
		case <-ctx.Done():
			e, _ := s.noAddress(s.now())
			return api.Assignment{}, s.refused(req, e)
		}
	}
}

// callerGone reports why an ADD's answer would reach nobody: its caller
// closed the connection (ctx done) or deadline (the request's; zero: none)
// has passed. nil: the caller still waits.
func callerGone(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("the plugin closed its connection (%w)", err)
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return fmt.Errorf("the plugin's deadline %s has passed", deadline.Format(time.RFC3339Nano))
	}
	return nil
}

// abandoned logs an ADD whose caller stopped waiting (why) and returns the
// error to answer with; addr is the address undone (invalid: none taken).
func (s *apiServer) abandoned(req api.AssignRequest, why error, addr netip.Addr) error {
	msg := "vpcipd: no address assigned: " + why.Error()
	if addr.IsValid() {
		msg = fmt.Sprintf("vpcipd: assignment of %s undone: %v", addr, why)
	}
	s.log.Warn("ADD abandoned by its caller: nothing assigned", "key", req.Key.String(), "pod", req.Pod.Namespace+"/"+req.Pod.Name, "undone", addr, "why", why)
	return &api.Error{Code: api.CodeNotReady, Message: msg}
}

// flushBeforeUse removes the conntrack entries of an address handed out
// before the daemon's background flush reached it (IP_COOLDOWN_PERIOD=0
// leaves no time to do it in the background; otherwise an ADD came within
// the batching window after the cooldown ended), in a dump that begins
// after the call, shared with the ADDs arriving meanwhile. A failed flush
// is logged and the ADD goes on: refusing would stop every reuse of the
// node's addresses for as long as ctnetlink fails.
func (s *apiServer) flushBeforeUse(ctx context.Context, a datastore.Assignment) {
	if err := s.flush.flush(ctx, []netip.Addr{a.Address}); err != nil {
		s.log.Error("conntrack flush of a reused address failed", "address", a.Address, "err", err)
		return
	}
	s.store.Conntrack().Flushed([]netip.Addr{a.Address}, a.FlushMark)
}

// refused counts and logs an ADD answered without an address, and has the
// Kubernetes part record the same cause as an Event on the pod.
func (s *apiServer) refused(req api.AssignRequest, e *api.Error) *api.Error {
	s.metrics.noAddress.WithLabelValues(string(e.Cause)).Inc()
	s.log.Info("no address for pod", "key", req.Key.String(), "cause", e.Cause, "msg", e.Message)
	if s.events != nil && e.Code == api.CodeNoAddress {
		s.events.NoAddress(req.Pod, e)
	}
	return e
}

// Release gives a key's address back (CNI DEL); it cools down for
// IP_COOLDOWN_PERIOD before any other key gets it. An unknown key is success.
func (s *apiServer) Release(req api.ReleaseRequest) (api.ReleaseResponse, error) {
	s.metrics.releases.Inc()
	s.adopt(req.Key, api.Pod{}, req.HostVeth)
	a, ok := s.store.Release(req.Key, s.now())
	if !ok {
		return api.ReleaseResponse{Version: api.Version}, nil
	}
	if err := s.ckpt.persist(); err != nil {
		// The release stands in memory; the next write records it. A crash
		// before that restores the assignment, which GC reclaims.
		s.log.Error("checkpoint write after release failed", "key", req.Key.String(), "err", err)
	}
	s.log.Debug("released", "key", req.Key.String(), "address", a.Address)
	s.imds.syncLogged(false)
	s.kick()
	w := s.wire(a)
	return api.ReleaseResponse{Version: api.Version, Released: true, Assignment: &w}, nil
}

// Check returns a key's assignment (CNI CHECK), or CodeNotFound.
func (s *apiServer) Check(req api.CheckRequest) (api.Assignment, error) {
	a, ok := s.store.Get(req.Key)
	if !ok {
		a, ok = s.adopt(req.Key, req.Pod, req.HostVeth)
	}
	if ok {
		return s.wire(a), nil
	}
	if !s.life.readyOK.Load() {
		return api.Assignment{}, &api.Error{Code: api.CodeNotReady, Message: "vpcipd is not ready: " + s.view.status().Reason}
	}
	return api.Assignment{}, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("vpcipd holds no address for %s", req.Key)}
}

// adopt matches an unknown key to an assignment re-held from its pod's host
// route after a lost checkpoint, and records it under the key.
func (s *apiServer) adopt(key api.Key, pod api.Pod, hostVeth string) (datastore.Assignment, bool) {
	a, ok := s.store.Adopt(key, pod, hostVeth)
	if !ok {
		return a, false
	}
	s.log.Info("recovered assignment matched to its attachment by host veth", "key", key.String(), "address", a.Address, "hostVeth", hostVeth)
	s.metrics.repaired("recovered_adopted", 1)
	if err := s.ckpt.persist(); err != nil {
		s.log.Error("checkpoint write after adopting a recovered assignment failed", "err", err)
	}
	return a, true
}

// GC releases every assignment of req.Network not listed in req.Valid and
// older than VPCIP_GC_GRACE (CNI spec 1.1 §GC): the one-step /v1/gc.
func (s *apiServer) GC(req api.GCRequest) (api.GCResponse, error) {
	return s.gcRelease(req, s.store.Collector().GC(req.Network, gcValid(req), s.cfg.GCGrace, s.now()))
}

// GCPlan lists what GC would release now and releases nothing
// (/v1/gc/plan): the plugin removes their host state first.
func (s *apiServer) GCPlan(req api.GCRequest) (api.GCResponse, error) {
	out := api.GCResponse{Version: api.Version, Released: []api.Assignment{}}
	for _, a := range s.store.Collector().Stale(req.Network, gcValid(req), s.cfg.GCGrace, s.now()) {
		out.Released = append(out.Released, s.wire(a))
	}
	return out, nil
}

// GCRelease releases the stale assignments req.Release names, each while
// its key still holds the listed address (/v1/gc/release).
func (s *apiServer) GCRelease(req api.GCRequest) (api.GCResponse, error) {
	only := make(map[api.Key]netip.Addr, len(req.Release))
	for _, t := range req.Release {
		only[t.Key] = t.Address
	}
	return s.gcRelease(req, s.store.Collector().GCOnly(req.Network, gcValid(req), s.cfg.GCGrace, s.now(), only))
}

func gcValid(req api.GCRequest) map[api.Key]bool {
	valid := make(map[api.Key]bool, len(req.Valid))
	for _, k := range req.Valid {
		valid[k] = true
	}
	return valid
}

// gcRelease records and answers what a GC released.
func (s *apiServer) gcRelease(req api.GCRequest, released []datastore.Assignment) (api.GCResponse, error) {
	out := api.GCResponse{Version: api.Version, Released: []api.Assignment{}}
	for _, a := range released {
		out.Released = append(out.Released, s.wire(a))
	}
	if len(released) > 0 {
		if err := s.ckpt.persist(); err != nil {
			s.log.Error("checkpoint write after GC failed", "err", err)
		}
		s.metrics.repaired("gc_released", len(released))
		s.log.Info("GC released stale attachments", "network", req.Network, "count", len(released))
		s.imds.syncLogged(false)
		s.kick()
	}
	return out, nil
}

// maxENINote names MAX_ENI when it, not the instance type, sets the limit.
func (s *apiServer) maxENINote(lim warmpool.Limits) string {
	custom := 0
	if s.cfg.CustomNetworking {
		custom = 1 // the primary ENI is not among lim.MaxENIs
	}
	if s.cfg.MaxENI > 0 && s.cfg.MaxENI-custom == lim.MaxENIs {
		return ", MAX_ENI"
	}
	return ""
}

// noAddress builds the CodeNoAddress answer with the most specific cause.
// final is true when waiting cannot help (node at its ENI limit with every
// address assigned, or at its pod limit): the ADD then fails at once (B19).
func (s *apiServer) noAddress(now time.Time) (e *api.Error, final bool) {
	st := s.view.status()
	c := s.store.Counts(now)
	self, lim := s.node.get()
	subnet := self.SubnetID
	active := map[warmpool.RefusalKind]time.Time{}
	for _, r := range s.pool.Refusals(now) {
		active[r.Kind] = r.Until
	}
	// st.ENIs counts the ENIs that hold pods (not the primary under custom networking), as lim.MaxENIs does.
	atLimit := lim.MaxENIs > 0 && st.ENIs >= lim.MaxENIs && c.Slots >= lim.MaxENIs*lim.SlotsPerENI
	tail := fmt.Sprintf("%d addresses assigned, %d cooling down, %d ENIs of %d", st.Assigned, st.Cooling, st.ENIs, st.MaxENIs)
	mk := func(cause api.Cause, format string, args ...any) *api.Error {
		return &api.Error{Code: api.CodeNoAddress, Cause: cause, Message: "no free address: " + fmt.Sprintf(format, args...)}
	}
	retry := func(k warmpool.RefusalKind) string { return active[k].UTC().Format(time.RFC3339) }
	switch _, throttled := active[warmpool.RefusedThrottled]; {
	case s.cfg.MaxPods > 0 && st.Assigned >= s.cfg.MaxPods:
		return mk(api.CauseMaxPods, "node holds its maximum of %d pods (VPCIP_MAX_PODS)", s.cfg.MaxPods), true
	case atLimit && st.Cooling == 0:
		return mk(api.CauseENILimit, "node at its ENI limit (%d of %d%s) and all %d addresses assigned", st.ENIs, lim.MaxENIs, s.maxENINote(lim), st.Assigned), true
	case atLimit:
		return mk(api.CauseCooldown, "node at its ENI limit (%d of %d): %d addresses assigned, %d cooling down for IP_COOLDOWN_PERIOD %s",
			st.ENIs, lim.MaxENIs, st.Assigned, st.Cooling, s.cfg.Cooldown), false
	case !active[warmpool.RefusedSubnetFull].IsZero():
		return mk(api.CauseSubnetFull, "subnet %s has no free addresses (EC2 InsufficientFreeAddressesInSubnet), growth retried after %s; %s",
			subnet, retry(warmpool.RefusedSubnetFull), tail), false
	case !active[warmpool.RefusedNoPrefix].IsZero() && s.cfg.PrefixDelegation:
		return mk(api.CauseNoPrefix, "subnet %s has no contiguous free /28 for a prefix (EC2 InsufficientCidrBlocks), retried after %s; %s",
			subnet, retry(warmpool.RefusedNoPrefix), tail), false
	case throttled:
		return mk(api.CauseThrottled, "EC2 is throttling this node's calls (RequestLimitExceeded), retried after %s; %s", retry(warmpool.RefusedThrottled), tail), false
	case !active[warmpool.RefusedENILimit].IsZero():
		return mk(api.CauseENILimit, "EC2 refused another ENI (AttachmentLimitExceeded); %s", tail), false
	}
	if p := s.placement().Problem; p != "" {
		return mk(api.CauseWaitingCloud, "no new ENI can be placed (%s); %s", p, tail), false
	}
	if f, ok := s.pool.LastFailure(now); ok {
		return mk(api.CauseWaitingCloud, "the pool's last %s failed (%v), retried after %s; %s", f.Action, f.Err, f.Until.UTC().Format(time.RFC3339), tail), false
	}
	return mk(api.CauseWaitingCloud, "pool refill in flight; %s", tail), false
}

// wire converts a datastore assignment to the protocol's.
func (s *apiServer) wire(a datastore.Assignment) api.Assignment {
	self, _ := s.node.get()
	table := 0 // the wire's "main table, no from rule"
	if a.DeviceNumber > 0 {
		table = routing.TableForDevice(a.DeviceNumber)
	}
	subnet, vpc := a.SubnetCIDR, self.VPCCIDRs
	if a.Address.Is6() { // IPv6 mode: the subnet's /64 and the VPC's /56s
		subnet, vpc = self.SubnetIPv6CIDR, self.VPCIPv6CIDRs
	}
	return api.Assignment{
		Version: api.Version, Key: a.Key, Pod: a.Pod, Address: a.Address,
		ENIID: a.ENIID, DeviceNumber: a.DeviceNumber, RouteTable: table,
		SubnetCIDR: subnet, VPCCIDRs: vpc, MTU: s.cfg.MTU, AssignedAt: a.AssignedAt,
	}
}
