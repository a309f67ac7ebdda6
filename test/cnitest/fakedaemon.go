package cnitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/routing"
)

// Daemon is what the suite needs of a daemon besides its wire protocol.
type Daemon interface {
	// Socket is the unix socket the plugin's ipamdSocket points at.
	Socket() string
	// Stop makes the daemon unreachable (process gone, socket refused).
	Stop(t testing.TB)
	// Start brings it back with the state it had (checkpoint).
	Start(t testing.TB)
}

// FakeAddress is one address of the double's pool.
type FakeAddress struct {
	Addr         netip.Addr // IPv4, or IPv6 as the daemon's IPv6 mode hands out (DeviceNumber 0)
	DeviceNumber int        // 0: primary ENI (main table); d ≥ 1: route table routing.TableForDevice(d)
}

// FakeDaemon serves ipamd/api over a unix socket from a fixed address list,
// for plugin-contract tests that need control the real daemon does not give
// (readiness, exhaustion). Assign is idempotent per key; GC releases at once
// (no grace period); released addresses go to the back of the free list.
// Releases by GC run the release hooks too, once per key.
// It is a test double of vpcipd's protocol only: the suite also runs against
// the real vpcipd on vpcsim.
type FakeDaemon struct {
	socket string
	mtu    int

	mu    sync.Mutex // guards the fields below
	free  []FakeAddress
	held  map[api.Key]api.Assignment
	ready bool
	calls map[string]int
	srv   *http.Server
	// noGCPlan makes it answer /v1/gc/plan and /v1/gc/release as a daemon
	// that predates them does (404, no endpoint).
	noGCPlan bool
	// beforeAssign runs before each assign is served, outside mu (a test's
	// way to act while an ADD waits for its address).
	beforeAssign func(api.AssignRequest)
	// beforeRelease runs before each release is served, outside mu (a
	// test's way to see the node as the address comes back).
	beforeRelease func(api.ReleaseRequest)
	// afterRelease runs after each release is recorded, before it is
	// answered, outside mu (a test's way to hand the address out at once).
	afterRelease func(api.ReleaseRequest)
	// afterGCPlan runs after each GC plan is made, before it is answered,
	// outside mu (a test's way to change things under a GC in progress).
	afterGCPlan func()
}

// AfterGCPlan sets fn to run after each /v1/gc/plan is made and before it
// is answered (nil: none); the GC that asked waits meanwhile.
func (d *FakeDaemon) AfterGCPlan(fn func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.afterGCPlan = fn
}

// Release gives k's address back as vpcipd does on its own (its check that
// the pod is gone, or the pod's deletion in the Kubernetes API).
func (d *FakeDaemon) Release(k api.Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releaseLocked(k)
}

// BeforeAssign sets fn to run before each assign is answered (nil: none);
// the ADD that asked waits meanwhile.
func (d *FakeDaemon) BeforeAssign(fn func(api.AssignRequest)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.beforeAssign = fn
}

// BeforeRelease sets fn to run before each release is answered (nil: none);
// the plugin that asked waits meanwhile.
func (d *FakeDaemon) BeforeRelease(fn func(api.ReleaseRequest)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.beforeRelease = fn
}

// AfterRelease sets fn to run after each release is recorded (the address
// is free again) and before it is answered (nil: none); the plugin that
// asked waits meanwhile.
func (d *FakeDaemon) AfterRelease(fn func(api.ReleaseRequest)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.afterRelease = fn
}

// WithoutGCPlan makes the double a daemon that predates the two-step GC:
// /v1/gc/plan and /v1/gc/release answer 404 (no endpoint), /v1/gc
// releases at once.
func (d *FakeDaemon) WithoutGCPlan() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.noGCPlan = true
}

// FakePool returns n addresses alternating between the primary ENI
// (100.64.1.x, main table) and a secondary ENI at device 1 (100.64.2.x,
// table 2), so every suite run exercises both rule sets.
func FakePool(n int) []FakeAddress {
	out := make([]FakeAddress, 0, n)
	for i := 0; i < n; i++ {
		dev := i % 2
		out = append(out, FakeAddress{Addr: netip.AddrFrom4([4]byte{100, 64, byte(1 + dev), byte(10 + i/2)}), DeviceNumber: dev})
	}
	return out
}

// NewFakeDaemon starts the double on a socket in a temp dir, ready, and
// stops it at cleanup. mtu is what its assignments carry (0: 9001).
func NewFakeDaemon(t testing.TB, pool []FakeAddress, mtu int) *FakeDaemon {
	t.Helper()
	if mtu == 0 {
		mtu = 9001
	}
	d := &FakeDaemon{
		socket: filepath.Join(t.TempDir(), "ipamd.sock"),
		mtu:    mtu, free: append([]FakeAddress(nil), pool...),
		held: map[api.Key]api.Assignment{}, ready: true, calls: map[string]int{},
	}
	d.Start(t)
	t.Cleanup(func() { d.Stop(t) })
	return d
}

// Socket implements Daemon.
func (d *FakeDaemon) Socket() string { return d.socket }

// SetReady sets what /v1/status reports; while not ready, assign and
// release answer not-ready, as a daemon restoring its checkpoint does.
func (d *FakeDaemon) SetReady(ready bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ready = ready
}

// Held returns the assignments the double holds now.
func (d *FakeDaemon) Held() map[api.Key]api.Assignment {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[api.Key]api.Assignment, len(d.held))
	for k, v := range d.held {
		out[k] = v
	}
	return out
}

// SetHeldAddress rewrites the address the daemon records for k, as a
// damaged record would: DEL must not act on another pod's wiring because of it.
func (d *FakeDaemon) SetHeldAddress(k api.Key, a netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	asg := d.held[k]
	asg.Address = a
	d.held[k] = asg
}

// Calls returns how many requests of a path ("/v1/assign") it served.
func (d *FakeDaemon) Calls(path string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[path]
}

// Start implements Daemon.
func (d *FakeDaemon) Start(t testing.TB) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.srv != nil {
		return
	}
	_ = os.Remove(d.socket)
	ln, err := net.Listen("unix", d.socket)
	if err != nil {
		t.Fatalf("listen %s: %v", d.socket, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/assign", d.handle(d.assign))
	mux.HandleFunc("POST /v1/release", d.handle(d.release))
	mux.HandleFunc("POST /v1/check", d.handle(d.check))
	mux.HandleFunc("POST /v1/gc", d.handle(d.gc))
	mux.HandleFunc("POST /v1/gc/plan", d.handle(d.gcPlan))
	mux.HandleFunc("POST /v1/gc/release", d.handle(d.gcRelease))
	mux.HandleFunc("GET /v1/status", d.handle(d.status))
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go d.srv.Serve(ln)
}

// Stop implements Daemon: the socket is closed and removed.
func (d *FakeDaemon) Stop(t testing.TB) {
	d.mu.Lock()
	srv := d.srv
	d.srv = nil
	d.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		_ = os.Remove(d.socket)
	}
}

type handlerFunc func(body []byte) (any, *api.Error)

func (d *FakeDaemon) handle(fn handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		d.mu.Lock()
		hook, before, after, afterPlan := d.beforeAssign, d.beforeRelease, d.afterRelease, d.afterGCPlan
		old := d.noGCPlan && (r.URL.Path == "/v1/gc/plan" || r.URL.Path == "/v1/gc/release")
		d.mu.Unlock()
		if old {
			// As vpcipd's catch-all answers a path it does not serve.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(&api.Error{Version: api.Version, Code: api.CodeInvalid,
				Message: "vpcipd: no endpoint POST " + r.URL.Path + " (see package ipamd/api)"})
			return
		}
		if hook != nil && r.URL.Path == "/v1/assign" {
			var req api.AssignRequest
			_ = json.Unmarshal(body, &req)
			hook(req)
		}
		// The releases this call may make, for the hooks: a DEL's, or
		// every key a GC would release.
		var rels []api.ReleaseRequest
		switch r.URL.Path {
		case "/v1/release":
			var rel api.ReleaseRequest
			_ = json.Unmarshal(body, &rel)
			rels = append(rels, rel)
		case "/v1/gc", "/v1/gc/release":
			d.mu.Lock()
			for _, k := range d.gcKeys(r.URL.Path, body) {
				rels = append(rels, api.ReleaseRequest{Version: api.Version, Key: k})
			}
			d.mu.Unlock()
		}
		if before != nil {
			for _, rel := range rels {
				before(rel)
			}
		}
		d.mu.Lock()
		d.calls[r.URL.Path]++
		out, aerr := fn(body)
		d.mu.Unlock()
		if gc, ok := out.(api.GCResponse); ok && r.URL.Path != "/v1/release" {
			rels = rels[:0]
			for _, a := range gc.Released {
				rels = append(rels, api.ReleaseRequest{Version: api.Version, Key: a.Key})
			}
		}
		if after != nil && aerr == nil {
			for _, rel := range rels {
				after(rel)
			}
		}
		if afterPlan != nil && aerr == nil && r.URL.Path == "/v1/gc/plan" {
			afterPlan()
		}
		w.Header().Set("Content-Type", "application/json")
		if aerr != nil {
			aerr.Version = api.Version
			status := http.StatusInternalServerError
			switch aerr.Code {
			case api.CodeNoAddress, api.CodeNotReady:
				status = http.StatusServiceUnavailable
			case api.CodeNotFound:
				status = http.StatusNotFound
			case api.CodeInvalid:
				status = http.StatusBadRequest
			}
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(aerr)
			return
		}
		_ = json.NewEncoder(w).Encode(out)
	}
}

func decode(body []byte, v any) *api.Error {
	if err := json.Unmarshal(body, v); err != nil {
		return &api.Error{Code: api.CodeInvalid, Message: "bad request: " + err.Error()}
	}
	return nil
}

func (d *FakeDaemon) assign(body []byte) (any, *api.Error) {
	var req api.AssignRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	if e := d.notReady(); e != nil {
		return nil, e
	}
	if a, ok := d.held[req.Key]; ok {
		return a, nil
	}
	if len(d.free) == 0 {
		return nil, &api.Error{Code: api.CodeNoAddress, Cause: api.CauseENILimit,
			Message: fmt.Sprintf("no free address: node at its ENI limit (2 of 2) and all %d addresses assigned", len(d.held))}
	}
	fa := d.free[0]
	d.free = d.free[1:]
	table := 0
	if fa.DeviceNumber > 0 {
		table = routing.TableForDevice(fa.DeviceNumber)
	}
	subnet, vpc := netip.PrefixFrom(fa.Addr, 24).Masked(), netip.MustParsePrefix("100.64.0.0/16")
	if fa.Addr.Is6() { // IPv6 mode: a /64 subnet of the VPC's /56
		subnet, vpc = netip.PrefixFrom(fa.Addr, 64).Masked(), netip.PrefixFrom(fa.Addr, 56).Masked()
	}
	a := api.Assignment{Version: api.Version, Key: req.Key, Pod: req.Pod, Address: fa.Addr,
		ENIID: fmt.Sprintf("eni-%d", fa.DeviceNumber), DeviceNumber: fa.DeviceNumber, RouteTable: table,
		SubnetCIDR: subnet, VPCCIDRs: []netip.Prefix{vpc}, MTU: d.mtu, AssignedAt: time.Now()}
	d.held[req.Key] = a
	return a, nil
}

func (d *FakeDaemon) releaseLocked(k api.Key) *api.Assignment {
	a, ok := d.held[k]
	if !ok {
		return nil
	}
	delete(d.held, k)
	d.free = append(d.free, FakeAddress{Addr: a.Address, DeviceNumber: a.DeviceNumber})
	return &a
}

func (d *FakeDaemon) notReady() *api.Error {
	if d.ready {
		return nil
	}
	return &api.Error{Code: api.CodeNotReady, Message: "vpcipd is restoring its state; try again"}
}

func (d *FakeDaemon) release(body []byte) (any, *api.Error) {
	var req api.ReleaseRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	if e := d.notReady(); e != nil {
		return nil, e
	}
	a := d.releaseLocked(req.Key)
	return api.ReleaseResponse{Version: api.Version, Released: a != nil, Assignment: a}, nil
}

func (d *FakeDaemon) check(body []byte) (any, *api.Error) {
	var req api.CheckRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	a, ok := d.held[req.Key]
	if !ok {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("no assignment for %s", req.Key)}
	}
	return a, nil
}

// gcKeys returns the keys a /v1/gc or /v1/gc/release body would release
// now (none for a malformed one). Caller holds d.mu.
func (d *FakeDaemon) gcKeys(path string, body []byte) []api.Key {
	var req api.GCRequest
	if json.Unmarshal(body, &req) != nil || (path == "/v1/gc/release" && (d.noGCPlan || req.Release == nil)) {
		return nil
	}
	var out []api.Key
	for _, a := range d.staleLocked(req) {
		out = append(out, a.Key)
	}
	return out
}

// staleLocked is what a GC of req releases: every assignment of its
// network not listed valid; for /v1/gc/release (req.Release given) only
// the listed ones still holding the listed address.
func (d *FakeDaemon) staleLocked(req api.GCRequest) []api.Assignment {
	valid := map[api.Key]bool{}
	for _, k := range req.Valid {
		valid[k] = true
	}
	only := map[api.Key]netip.Addr{}
	for _, t := range req.Release {
		only[t.Key] = t.Address
	}
	var out []api.Assignment
	for k, a := range d.held {
		if k.Network != req.Network || valid[k] {
			continue
		}
		if req.Release != nil && only[k] != a.Address {
			continue
		}
		out = append(out, a)
	}
	return out
}

func (d *FakeDaemon) gc(body []byte) (any, *api.Error) {
	var req api.GCRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	req.Release = nil // /v1/gc releases every stale assignment
	out := api.GCResponse{Version: api.Version, Released: []api.Assignment{}}
	for _, a := range d.staleLocked(req) {
		out.Released = append(out.Released, *d.releaseLocked(a.Key))
	}
	return out, nil
}

func (d *FakeDaemon) gcPlan(body []byte) (any, *api.Error) {
	var req api.GCRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	req.Release = nil
	out := api.GCResponse{Version: api.Version, Released: []api.Assignment{}}
	out.Released = append(out.Released, d.staleLocked(req)...)
	return out, nil
}

func (d *FakeDaemon) gcRelease(body []byte) (any, *api.Error) {
	var req api.GCRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	if req.Release == nil {
		req.Release = []api.GCTarget{} // nothing listed: nothing released
	}
	out := api.GCResponse{Version: api.Version, Released: []api.Assignment{}}
	for _, a := range d.staleLocked(req) {
		out.Released = append(out.Released, *d.releaseLocked(a.Key))
	}
	return out, nil
}

func (d *FakeDaemon) status([]byte) (any, *api.Error) {
	st := api.Status{Version: api.Version, Ready: d.ready, Counts: api.Counts{Assigned: len(d.held), Warm: len(d.free)}}
	if !d.ready {
		st.Reason = "restoring checkpoint"
	}
	return st, nil
}
