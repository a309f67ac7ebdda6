package ipamd

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/warmpool"
)

// TestWarmUpFromEmptyInOneRound: a new node reaches its warm target in the
// first pool cycle, with one growth call per ENI and one Describe at start.
func TestWarmUpFromEmptyInOneRound(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "20"})
	n.start()
	f := c.Cloud.Faults()
	st := n.status()
	if !st.Ready || st.Warm < 20 || st.Assigned != 0 {
		t.Fatalf("status after warm-up: %+v, want ready with ≥ 20 warm", st)
	}
	sum := warmpool.Summarize(n.d.pool.Input(n.clock.Now()))
	if sum.Short != 0 {
		t.Errorf("pool still short %d after the first cycle: %+v", sum.Short, sum)
	}
	growth := f.Calls("AssignPrivateIpAddresses") + f.Calls("CreateNetworkInterface")
	if growth != st.ENIs {
		t.Errorf("%d growth calls for %d ENIs, want one per ENI", growth, st.ENIs)
	}
	// The provider reads the next free device number once per CreateENI;
	// besides those, the start takes one batched Describe (B08).
	if got := f.Calls("DescribeNetworkInterfaces") - f.Calls("CreateNetworkInterface"); got != 1 {
		t.Errorf("%d DescribeNetworkInterfaces at start besides CreateENI's, want 1 (B08)", got)
	}
	n.checkMirror()
}

// TestB30IdempotentADD: ADD twice for one key gives one address.
func TestB30IdempotentADD(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	a1 := n.mustAdd("c1")
	a2 := n.mustAdd("c1")
	if a1.Address != a2.Address || !a1.AssignedAt.Equal(a2.AssignedAt) {
		t.Fatalf("second ADD(c1) = %s, first %s", a2.Address, a1.Address)
	}
	if got := len(n.d.store.Assignments()); got != 1 {
		t.Errorf("%d assignments after ADD(c1) twice, want 1", got)
	}
	n.del("c1")
	if _, ok := n.d.store.Get(key("c1")); ok {
		t.Error("c1 still holds an address after DEL")
	}
	n.checkInvariants()
}

// TestADDAbandonedByItsCallerAssignsNothing: an ADD the daemon gets to only
// after its plugin gave up (the daemon was stopped or slow: the request's
// deadline has passed, or its connection is closed) assigns nothing, as the
// runtime's DEL may already have come and gone and nothing would give the
// address back; a repeated ADD of a key that holds its address still gets it.
func TestADDAbandonedByItsCallerAssignsNothing(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	late := api.AssignRequest{Key: key("late"), Pod: api.Pod{Namespace: "default", Name: "p-late"}, Deadline: time.Now().Add(-time.Second)}
	_, err := n.client.Assign(context.Background(), late)
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeNotReady || !strings.Contains(e.Message, "deadline") {
		t.Errorf("ADD past its deadline: %v; want CodeNotReady naming the deadline", err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 { // a plugin without a deadline: only its closed connection tells (once was a coin toss against the ready wait)
		if _, err := n.d.api.Assign(gone, api.AssignRequest{Key: key("gone"), Pod: api.Pod{Namespace: "default", Name: "p-gone"}}); err == nil {
			t.Fatal("ADD whose caller has gone was answered with an address")
		}
	}
	for _, c := range []string{"late", "gone"} {
		if a, ok := n.d.store.Get(key(c)); ok {
			t.Errorf("%s holds %s after an abandoned ADD", c, a.Address)
		}
	}
	held := n.mustAdd("held")
	again, err := n.d.api.Assign(context.Background(), api.AssignRequest{Key: key("held"), Pod: api.Pod{Namespace: "default", Name: "p-held"}, Deadline: time.Now().Add(time.Minute)})
	if err != nil || again.Address != held.Address {
		t.Errorf("repeated ADD(held) = %v, %v; want %s", again.Address, err, held.Address)
	}
	if _, err := n.d.api.Assign(gone, api.AssignRequest{Key: key("held"), Pod: api.Pod{Namespace: "default", Name: "p-held"}}); err == nil {
		t.Error("repeated ADD(held) with its caller gone was answered")
	}
	if a, ok := n.d.store.Get(key("held")); !ok || a.Address != held.Address {
		t.Errorf("held lost %s after a repeated ADD whose caller had gone", held.Address)
	}
	n.checkInvariants()
}

// TestB14DELUnknownKeyIsSuccess: DEL of a key never ADDed succeeds and
// touches nothing.
func TestB14DELUnknownKeyIsSuccess(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	a2 := n.mustAdd("c2")
	before := n.d.store.Assignments()
	r := n.del("cX")
	if r.Released || r.Assignment != nil {
		t.Fatalf("DEL(cX) = %+v, want nothing released", r)
	}
	after := n.d.store.Assignments()
	if len(after) != len(before) || after[0].Address != a2.Address || after[0].Key != key("c2") {
		t.Errorf("DEL(cX) changed assignments: %v → %v", before, after)
	}
	n.del("c2")
	if r := n.del("c2"); r.Released {
		t.Error("second DEL(c2) released again")
	}
}

// TestB19ENILimitFailsFastWithCause: a full node answers CodeNoAddress
// with cause eni-limit and the numbers at once, without waiting out
// VPCIP_ADD_WAIT (B19: fail fast on a capacity limit).
func TestB19ENILimitFailsFastWithCause(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_ADD_WAIT": "10m"})
	n.start()
	for _, id := range names("c", 27) {
		n.mustAdd(id)
	}
	_, err := n.add("c27")
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeNoAddress || e.Cause != api.CauseENILimit {
		t.Fatalf("ADD on a full node: %v, want no-address/eni-limit", err)
	}
	want := "no free address: node at its ENI limit (3 of 3) and all 27 addresses assigned"
	if e.Message != want {
		t.Errorf("message %q, want %q", e.Message, want)
	}
	if !e.Retryable() {
		t.Error("no-address error is not retryable")
	}
	st := n.status()
	if st.Assigned != 27 || st.ENIs != 3 || st.MaxENIs != 3 || st.Budget != 27 || st.Capacity != 27 {
		t.Errorf("status %+v", st)
	}
	n.checkInvariants()
}

// TestB19MaxPodsFailsFast: beyond VPCIP_MAX_PODS an ADD fails at once with
// cause max-pods, though the ENIs have room.
func TestB19MaxPodsFailsFast(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_MAX_PODS": "3", "VPCIP_ADD_WAIT": "10m"})
	n.start()
	for _, id := range names("c", 3) {
		n.mustAdd(id)
	}
	_, err := n.add("c3")
	var e *api.Error
	if !errors.As(err, &e) || e.Cause != api.CauseMaxPods || !strings.Contains(e.Message, "maximum of 3 pods") {
		t.Fatalf("ADD beyond max pods: %v", err)
	}
	if v := counter(t, n, "vpcip_add_no_address_total", map[string]string{"cause": "max-pods"}); v != 1 {
		t.Errorf("no-address counter for max-pods = %v, want 1", v)
	}
}

// TestMaxPodsHoldsWithWarmAddresses: VPCIP_MAX_PODS caps assignments even
// when warm addresses remain (here: the limit lowered across a restart).
func TestMaxPodsHoldsWithWarmAddresses(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "5"})
	n.start()
	for _, id := range names("c", 3) {
		n.mustAdd(id)
	}
	n.env = map[string]string{"WARM_IP_TARGET": "5", "VPCIP_MAX_PODS": "3", "VPCIP_ADD_WAIT": "10m"}
	n.restart()
	if st := n.status(); st.Warm == 0 {
		t.Fatalf("no warm address left to test with: %+v", st)
	}
	_, err := n.add("c3")
	var e *api.Error
	if !errors.As(err, &e) || e.Cause != api.CauseMaxPods {
		t.Fatalf("ADD beyond VPCIP_MAX_PODS with warm addresses: %v, want cause max-pods", err)
	}
	if st := n.status(); st.Assigned != 3 {
		t.Errorf("assigned %d, want 3", st.Assigned)
	}
}

// TestSocketModeAndStaleSocket: the socket is 0600 and a stale socket file
// from a crashed daemon does not stop the next start.
func TestSocketModeAndStaleSocket(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	fi, err := os.Stat(n.d.cfg.Socket)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v mode %v", err, fi.Mode())
	}
	a := n.mustAdd("c1")
	n.shutdown()
	// A crashed daemon leaves its socket file; make one.
	ln, err := listenSocket(n.d.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ln.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	ln.Close()
	n.start()
	if got := n.mustAdd("c1"); got.Address != a.Address {
		t.Errorf("after restart ADD(c1) = %s, want %s", got.Address, a.Address)
	}
}

// TestBadRequestsAnswerInvalid: malformed or incomplete requests get
// CodeInvalid and change nothing.
func TestBadRequestsAnswerInvalid(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	ctx := context.Background()
	huge := strings.Repeat("c", 3<<20) // a 3 MiB container ID would bloat the checkpoint
	for _, k := range []api.Key{{}, {Network: "vpcip", ContainerID: "c1"}, {ContainerID: "c1", IfName: "eth0"},
		{Network: "vpcip", ContainerID: huge, IfName: "eth0"}, {Network: "vpcip", ContainerID: "c1", IfName: "an-interface-name-too-long"}} {
		_, err := n.client.Assign(ctx, api.AssignRequest{Key: k})
		var e *api.Error
		if !errors.As(err, &e) || e.Code != api.CodeInvalid {
			t.Errorf("Assign(%.80s) = %v, want invalid-request", k.String(), err)
		}
	}
	for _, p := range []api.Pod{{Name: strings.Repeat("n", 60000)}, {Namespace: strings.Repeat("n", 254)}, {UID: huge}} {
		_, err := n.client.Assign(ctx, api.AssignRequest{Key: key("c1"), Pod: p})
		var e *api.Error
		if !errors.As(err, &e) || e.Code != api.CodeInvalid {
			t.Errorf("Assign with pod %.40v… = %v, want invalid-request", p, err)
		}
	}
	if len(n.d.store.Assignments()) != 0 {
		t.Error("a bad request assigned an address")
	}
	_, err := n.client.Check(ctx, api.CheckRequest{Key: key("nobody")})
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeNotFound {
		t.Errorf("Check(unknown) = %v, want not-found", err)
	}
	_, err = n.client.GC(ctx, api.GCRequest{Network: "vpcip", Valid: []api.Key{{Network: "other", ContainerID: "c", IfName: "eth0"}}})
	if !errors.As(err, &e) || e.Code != api.CodeInvalid {
		t.Errorf("GC listing another network's key = %v, want invalid-request", err)
	}
	for _, body := range []string{`{"version":"v9","key":{"network":"vpcip","containerID":"c1","ifName":"eth0"}}`, `{`, ``} {
		status, got := rawPost(t, n.d.cfg.Socket, "/v1/assign", body)
		if status != http.StatusBadRequest || got.Code != api.CodeInvalid || got.Message == "" {
			t.Errorf("POST /v1/assign %q = %d %+v, want 400 invalid-request with a message", body, status, got)
		}
	}
	if len(n.d.store.Assignments()) != 0 {
		t.Error("a bad request assigned an address")
	}
}

// rawPost sends body to the daemon's socket and decodes the error answer.
func rawPost(t *testing.T, socket, path, body string) (int, api.Error) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	resp, err := c.Post("http://vpcipd"+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e
}

// TestShutdownAnswersWaitingADD: an ADD waiting for a refill when the daemon
// is told to stop gets a retryable answer, not a broken connection, and the
// checkpoint holds every answered assignment.
func TestShutdownAnswersWaitingADD(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "1", "VPCIP_ADD_WAIT": "1m"})
	n.start()
	a := n.mustAdd("c1")
	n.cycle() // the refill after c1 is done
	f := c.Cloud.Faults()
	f.SetLatency("AssignPrivateIpAddresses", time.Minute, 0)
	f.SetLatency("CreateNetworkInterface", time.Minute, 0)
	n.mustAdd("c2") // takes the warm address; the refill hangs
	errc := make(chan error, 1)
	go func() { _, err := n.add("c3"); errc <- err }()
	eventually(t, "c3 waiting", func() bool { return n.d.api.waiting.Load() == 1 })
	n.shutdown()
	err := <-errc
	var e *api.Error
	if !errors.As(err, &e) || !e.Retryable() {
		t.Fatalf("waiting ADD at shutdown: %v, want a retryable answer", err)
	}
	st, _, err := checkpoint.Load(n.d.cfg.Checkpoint)
	if err != nil || len(st.Assignments) != 2 || st.Assignments[0].Address != a.Address && st.Assignments[1].Address != a.Address {
		t.Errorf("checkpoint after shutdown: %+v %v", st.Assignments, err)
	}
}

// TestENILimitMessageNamesMaxENI: when MAX_ENI, not the instance type, sets
// the limit, the refusal says so.
func TestENILimitMessageNamesMaxENI(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"MAX_ENI": "1", "VPCIP_ADD_WAIT": "10m"})
	n.start()
	for _, id := range names("c", 9) {
		n.mustAdd(id)
	}
	_, err := n.add("c9")
	var e *api.Error
	if !errors.As(err, &e) || e.Cause != api.CauseENILimit || !strings.Contains(e.Message, "(1 of 1, MAX_ENI)") {
		t.Fatalf("ADD beyond MAX_ENI: %v, want an ENI-limit refusal naming MAX_ENI", err)
	}
}

// TestGCPlanAndRelease: over the socket, /v1/gc/plan lists the stale
// assignment and releases nothing; /v1/gc/release releases it only under
// the address the plan gave; a release naming nothing releases nothing.
func TestGCPlanAndRelease(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_GC_GRACE": "30s"})
	n.start()
	ctx := context.Background()
	live, stale := n.mustAdd("live"), n.mustAdd("stale")
	n.clock.Advance(31 * time.Second)
	req := api.GCRequest{Network: "vpcip", Valid: []api.Key{live.Key}}
	plan, err := n.client.GCPlan(ctx, req)
	if err != nil {
		t.Fatalf("GCPlan: %v", err)
	}
	if len(plan.Released) != 1 || plan.Released[0].Key != stale.Key || plan.Released[0].Address != stale.Address {
		t.Fatalf("GCPlan = %+v, want only %s (%v)", plan.Released, stale.Key, stale.Address)
	}
	for _, r := range [][]api.GCTarget{nil, {{Key: stale.Key, Address: live.Address}}} {
		req.Release = r
		resp, err := n.client.GCRelease(ctx, req)
		if err != nil || len(resp.Released) != 0 {
			t.Errorf("GCRelease(%v) = %+v, %v; want nothing released", r, resp.Released, err)
		}
	}
	if got := len(n.d.store.Assignments()); got != 2 {
		t.Fatalf("%d assignments after the plan and the empty or mismatched releases, want 2", got)
	}
	req.Release = []api.GCTarget{{Key: stale.Key, Address: stale.Address}, {Key: live.Key, Address: live.Address}}
	resp, err := n.client.GCRelease(ctx, req)
	if err != nil || len(resp.Released) != 1 || resp.Released[0].Key != stale.Key {
		t.Fatalf("GCRelease = %+v, %v; want %s released (and the valid %s kept)", resp.Released, err, stale.Key, live.Key)
	}
	if _, ok := n.d.store.Get(live.Key); !ok {
		t.Errorf("GCRelease released the valid %s", live.Key)
	}
}

// TestAbandonedADDDoesNotUndoARepeatedADDsAnswer: an ADD whose caller gives
// up while its checkpoint write is slow undoes its assignment; a repeated
// ADD of the same key (the runtime's retry) waits for it rather than being
// answered the same address meanwhile, which the undo would then take from
// under its pod (found by review).
func TestAbandonedADDDoesNotUndoARepeatedADDsAnswer(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	n.setSave(func(p string, st checkpoint.State) error {
		select {
		case entered <- struct{}{}:
			<-gate // the first write is slow
		default:
		}
		return checkpoint.Save(p, st)
	})
	k := key("same")
	pod := api.Pod{Namespace: "default", Name: "p-same"}
	first := make(chan error, 1)
	go func() {
		_, err := n.d.api.Assign(context.Background(), api.AssignRequest{Key: k, Pod: pod, Deadline: time.Now().Add(300 * time.Millisecond)})
		first <- err
	}()
	<-entered
	second := make(chan api.Assignment, 1)
	go func() {
		a, err := n.d.api.Assign(context.Background(), api.AssignRequest{Key: k, Pod: pod, Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Errorf("repeated ADD: %v", err)
		}
		second <- a
	}()
	time.Sleep(400 * time.Millisecond) // past the first ADD's deadline
	close(gate)
	if err := <-first; err == nil {
		t.Error("the ADD past its deadline was answered with an address")
	}
	a2 := <-second
	if got, ok := n.d.store.Get(k); !ok || got.Address != a2.Address {
		t.Errorf("the repeated ADD was answered %s, but the daemon holds %v for the key (held %v)", a2.Address, got.Address, ok)
	}
	n.checkInvariants()
}
