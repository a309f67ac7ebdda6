package ipamd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/provider"
)

// TestB03NoDuplicateRightAfterRestart: after a restart, ADDs wait (and end
// not-ready) until the checkpoint is loaded and EC2 has answered; then the
// new pod never gets a live pod's address.
func TestB03NoDuplicateRightAfterRestart(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "1", "VPCIP_ADD_WAIT": "300ms"})
	n.start()
	a1 := n.mustAdd("c1")
	n.cycle()
	n.shutdown()

	gate := make(chan struct{})
	n.wrap = func(p provider.Provider) provider.Provider { return &gatedENIs{Provider: p, gate: gate} }
	n.startNoWait()
	eventually(t, "socket", func() bool { _, err := n.client.Status(context.Background()); return err == nil })
	if st := n.status(); st.Ready || st.Reason == "" {
		t.Fatalf("status before the cloud answered: %+v, want not ready with a reason", st)
	}
	_, err := n.add("c2")
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeNotReady || !e.Retryable() {
		t.Fatalf("ADD(c2) before ready: %v, want retryable not-ready", err)
	}
	if got, err := n.client.Check(context.Background(), api.CheckRequest{Key: key("c1")}); err != nil || got.Address != a1.Address {
		t.Errorf("CHECK(c1) before ready = %v, %v; want %s from the checkpoint", got.Address, err, a1.Address)
	}
	close(gate)
	<-n.d.Ready()
	a2 := n.mustAdd("c2")
	if a2.Address == a1.Address {
		t.Fatalf("c2 got c1's address %s", a1.Address)
	}
	n.checkInvariants()
}

// TestB11CooldownSurvivesRestart: the release time is checkpointed, so after
// a restart the address is not reused before IP_COOLDOWN_PERIOD.
func TestB11CooldownSurvivesRestart(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{
		"IP_COOLDOWN_PERIOD": "30", "MAX_ENI": "1", "WARM_IP_TARGET": "1", "VPCIP_ADD_WAIT": "300ms"})
	n.start()
	var a1 api.Assignment
	for _, id := range names("c", 9) { // the primary ENI's 9 secondary addresses
		a := n.mustAdd(id)
		if id == "c1" {
			a1 = a
		}
	}
	t0 := n.clock.Now()
	n.del("c1")
	n.clock.Advance(time.Second)
	n.restart()

	st, _, err := checkpoint.Load(n.d.cfg.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range st.Cooling {
		found = found || (c.Address == a1.Address && c.UnassignedAt.Equal(t0))
	}
	if !found {
		t.Fatalf("checkpoint cooling %+v lacks %s released at %s", st.Cooling, a1.Address, t0)
	}

	n.clock.Advance(time.Second) // t0+2s
	_, err = n.add("c10")
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeNoAddress || e.Cause != api.CauseCooldown {
		t.Fatalf("ADD within cooldown after restart: %v, want no-address/cooldown", err)
	}
	n.clock.Advance(29 * time.Second) // t0+31s
	if got := n.mustAdd("c10"); got.Address != a1.Address {
		t.Errorf("after cooldown ADD(c10) = %s, want %s", got.Address, a1.Address)
	}
	n.checkInvariants()
}

// TestB39CorruptCheckpointRecovers: each kind of damaged checkpoint is moved
// aside; the daemon rebuilds from EC2 and the host's pod routes, keeps the
// running pods' addresses, and serves ADD and DEL.
func TestB39CorruptCheckpointRecovers(t *testing.T) {
	kinds := []struct {
		name    string
		corrupt func(path string) error
		moved   bool
	}{
		{"NUL-filled", func(p string) error { return os.WriteFile(p, bytes.Repeat([]byte{0}, 4096), 0o600) }, true},
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o600) }, true},
		{"truncated", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, b[:len(b)/2], 0o600)
		}, true},
		{"unknown-version", func(p string) error {
			return os.WriteFile(p, []byte(`{"version":99,"assignments":[]}`), 0o600)
		}, true},
		{"stale-lock-file", func(p string) error { return os.WriteFile(p+".lock", []byte("4242"), 0o600) }, false},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			c := startCloud(t)
			n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_GC_GRACE": "10s"})
			host := newMemHost()
			n.host = host
			n.start()
			live := map[netip.Addr]bool{}
			for _, id := range names("c", 5) {
				a := n.mustAdd(id)
				host.wire(a.Address, "eni"+id)
				live[a.Address] = true
			}
			c1, _ := n.d.store.Get(key("c1"))
			n.shutdown()
			path := n.d.cfg.Checkpoint
			if err := k.corrupt(path); err != nil {
				t.Fatal(err)
			}
			n.start()

			moved, _ := filepath.Glob(path + ".corrupt-*")
			if k.moved != (len(moved) == 1) {
				t.Errorf("quarantined files %v, want moved=%v", moved, k.moved)
			}
			if st := n.status(); !st.Ready || st.Assigned != 5 {
				t.Fatalf("after restart: %+v, want ready with the 5 pods' addresses held", st)
			}
			a6 := n.mustAdd("c6")
			if live[a6.Address] {
				t.Fatalf("ADD(c6) got live pod address %s", a6.Address)
			}
			host.wire(a6.Address, "enic6")
			if r := n.del("c1"); k.moved == r.Released {
				t.Errorf("DEL(c1) released=%v; the key is known only with an intact checkpoint", r.Released)
			}
			// The plugin's DEL removed c1's route; the daemon frees the
			// address it held for the unknown pod within two reconciliations.
			host.unwire(c1.Address)
			n.clock.Advance(11 * time.Second)
			n.reconcile()
			n.reconcile()
			if h, ok := n.d.store.Holder(c1.Address); ok {
				t.Errorf("c1's address still held by %s after its route went", h.Key)
			}
			if st := n.status(); st.Assigned != 5 {
				t.Errorf("assigned %d, want 5 (c0, c2-c4 and c6)", st.Assigned)
			}
			n.checkInvariants()
		})
	}
}

// TestB34CorruptEntryDoesNotBlockDEL: one unreadable checkpoint entry is
// dropped (and the file rewritten without it); DEL of its key succeeds, the
// address is not reused before the cooldown, other pods are unaffected.
func TestB34CorruptEntryDoesNotBlockDEL(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"IP_COOLDOWN_PERIOD": "30"})
	n.start()
	a1 := n.mustAdd("c1")
	a2 := n.mustAdd("c2")
	n.shutdown()
	path := n.d.cfg.Checkpoint
	var doc map[string]any
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, e := range doc["assignments"].([]any) {
		m := e.(map[string]any)
		if m["key"].(map[string]any)["containerID"] == "c1" {
			m["address"] = "garbage"
		}
	}
	b, _ = json.Marshal(doc)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	n.start()
	if r := n.del("c1"); r.Released {
		t.Errorf("DEL(c1) released %+v from a dropped entry", r.Assignment)
	}
	if got, ok := n.d.store.Get(key("c2")); !ok || got.Address != a2.Address {
		t.Errorf("c2 = %+v, want %s kept", got, a2.Address)
	}
	if h, ok := n.d.store.Holder(a1.Address); ok {
		t.Errorf("c1's address held by %s", h.Key)
	}
	for _, id := range names("n", 3) {
		if a := n.mustAdd(id); a.Address == a1.Address {
			t.Errorf("c1's address reused within the cooldown by %s", id)
		}
	}
	st, dropped, err := checkpoint.Load(path)
	if err != nil || len(dropped) != 0 || strings.Contains(mustRead(t, path), "garbage") {
		t.Errorf("checkpoint not rewritten cleanly: %v, dropped %v", err, dropped)
	}
	if len(st.Assignments) != 4 {
		t.Errorf("checkpoint holds %d assignments, want 4", len(st.Assignments))
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestForeignCheckpointDiscarded: a checkpoint written on another instance
// (a reused disk or image) is moved aside, not trusted.
func TestForeignCheckpointDiscarded(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"IP_COOLDOWN_PERIOD": "30"})
	n.start()
	a := n.mustAdd("c1")
	n.shutdown()
	path := n.d.cfg.Checkpoint
	st, _, err := checkpoint.Load(path)
	if err != nil || st.InstanceID != n.inst.ID {
		t.Fatalf("checkpoint instance %q (%v), want %s", st.InstanceID, err, n.inst.ID)
	}
	st.InstanceID = "i-0000000000000000f"
	if err := checkpoint.Save(path, st); err != nil {
		t.Fatal(err)
	}
	n.start()
	if _, ok := n.d.store.Get(key("c1")); ok {
		t.Error("an assignment from another instance's checkpoint was trusted")
	}
	if moved, _ := filepath.Glob(path + ".corrupt-*"); len(moved) != 1 {
		t.Errorf("foreign checkpoint not moved aside: %v", moved)
	}
	if b := n.mustAdd("c2"); b.Address == a.Address {
		t.Errorf("c2 got %s within the cooldown the lost checkpoint implies", a.Address)
	}
}

// TestB29FailedCheckpointWriteHoldsNothing: an ADD whose assignment cannot
// be written to the checkpoint fails and holds no address; once writes work
// again the next ADD succeeds.
func TestB29FailedCheckpointWriteHoldsNothing(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	dir := filepath.Dir(n.d.cfg.Checkpoint)
	moved := dir + ".moved"
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, id := range names("s", 50) {
		_, err := n.add(id)
		var e *api.Error
		if !errors.As(err, &e) || e.Code != api.CodeInternal || !strings.Contains(e.Message, "checkpoint") {
			t.Fatalf("ADD(%s) with checkpoint writes failing: %v", id, err)
		}
	}
	if got := len(n.d.store.Assignments()); got != 0 {
		t.Fatalf("%d addresses held after 50 failed ADDs", got)
	}
	os.Remove(dir)
	if err := os.Rename(moved, dir); err != nil {
		t.Fatal(err)
	}
	a := n.mustAdd("s0")
	st, _, err := checkpoint.Load(n.d.cfg.Checkpoint)
	if err != nil || len(st.Assignments) != 1 || st.Assignments[0].Address != a.Address {
		t.Errorf("checkpoint after writes recovered: %+v, %v", st.Assignments, err)
	}
}

// TestNotDurableCheckpointKeepsTheADD: an ADD whose checkpoint reached the
// file but whose directory fsync failed (checkpoint.ErrNotDurable) keeps its
// address: the file records it, and undoing the ADD would free an address
// the file still gives the pod (#25 kind 8; before, the ADD failed and its
// address was freed while the file held it).
func TestNotDurableCheckpointKeepsTheADD(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	n.d.ckpt.mu.Lock()
	n.d.ckpt.save = func(path string, st checkpoint.State) error {
		if err := checkpoint.Save(path, st); err != nil {
			return err
		}
		return fmt.Errorf("%w: fsync checkpoint directory: input/output error", checkpoint.ErrNotDurable)
	}
	n.d.ckpt.mu.Unlock()
	a, err := n.add("c1")
	if err != nil {
		t.Fatalf("ADD with a not-durable checkpoint write: %v", err)
	}
	st, _, err := checkpoint.Load(n.d.cfg.Checkpoint)
	if err != nil || len(st.Assignments) != 1 || st.Assignments[0].Address != a.Address {
		t.Errorf("checkpoint: %+v, %v; want c1's %v", st.Assignments, err, a.Address)
	}
	if h, ok := n.d.store.Holder(a.Address); !ok || h.Key != key("c1") {
		t.Errorf("daemon holds %v for %v (%v), want c1", a.Address, h.Key, ok)
	}
}

// TestHostViewLosingAllRoutesFreesNothing: when the host suddenly shows no
// route for most pods (a broken view, not dead pods: their sandboxes' netns
// live), nothing is released; a pod whose sandbox is gone is.
func TestHostViewLosingAllRoutesFreesNothing(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_GC_GRACE": "10s"})
	n.host = host
	n.start()
	var addrs []netip.Addr
	for _, id := range names("c", 6) {
		a := n.mustAdd(id)
		host.wire(a.Address, "eni"+id)
		addrs = append(addrs, a.Address)
	}
	n.clock.Advance(10 * time.Second) // past VPCIP_GC_GRACE
	for _, a := range addrs {
		host.unwire(a)
	}
	for range 3 {
		n.reconcile()
	}
	if st := n.status(); st.Assigned != 6 {
		t.Errorf("%d of 6 assignments left after the host view emptied", st.Assigned)
	}
	for _, a := range addrs[1:] { // the view heals; only c0's route stays gone
		host.wire(a, "eni"+a.String())
	}
	n.dropSandbox("c0") // c0's pod left without a DEL
	n.reconcile()
	n.reconcile()
	if _, ok := n.d.store.Get(key("c0")); ok {
		t.Error("c0, whose route alone is gone, still holds its address")
	}
	if st := n.status(); st.Assigned != 5 {
		t.Errorf("%d assignments, want 5", st.Assigned)
	}
	// The pod left without a DEL: its rules must go with its address.
	host.mu.Lock()
	removed := slices.Clone(host.rulesRemoved)
	host.mu.Unlock()
	if !slices.Equal(removed, addrs[:1]) {
		t.Errorf("pod rules removed for %v, want exactly c0's %v", removed, addrs[0])
	}
}

// TestRecoveredAssignmentsAdoptedByHostVeth_B33: after a lost checkpoint the
// daemon re-holds live pods' addresses from their host routes under
// placeholder keys. The plugin's CHECK and DEL name the pod's host veth, so a
// healthy pod's CHECK finds its address again (and keeps it under its real
// key), and its DEL releases it at once instead of after the route-less grace.
func TestRecoveredAssignmentsAdoptedByHostVeth_B33(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	host := newMemHost()
	n.host = host
	n.start()
	a1 := n.mustAdd("c1")
	a2 := n.mustAdd("c2")
	host.wire(a1.Address, "enic1")
	host.wire(a2.Address, "enic2")
	n.shutdown()
	if err := os.WriteFile(n.d.cfg.Checkpoint, bytes.Repeat([]byte{0}, 512), 0o600); err != nil {
		t.Fatal(err)
	}
	n.start()
	ctx := context.Background()
	if _, err := n.client.Check(ctx, api.CheckRequest{Key: key("c1")}); err == nil {
		t.Fatal("CHECK without a host veth found c1 although the checkpoint was lost")
	}
	got, err := n.client.Check(ctx, api.CheckRequest{Key: key("c1"), HostVeth: "enic1", Pod: api.Pod{Namespace: "default", Name: "p1"}})
	if err != nil || got.Address != a1.Address {
		t.Fatalf("CHECK(c1, enic1) = %v, %v; want its address %s", got.Address, err, a1.Address)
	}
	if h, ok := n.d.store.Get(key("c1")); !ok || h.Recovered || h.Pod.Name != "p1" {
		t.Errorf("c1 after adoption: %+v, %v; want held under its own key with its pod", h, ok)
	}
	if _, err := n.client.Check(ctx, api.CheckRequest{Key: key("c9"), HostVeth: "enic1"}); err == nil {
		t.Error("a second key adopted c1's address through the same veth")
	}
	r, err := n.client.Release(ctx, api.ReleaseRequest{Key: key("c2"), HostVeth: "enic2"})
	if err != nil || !r.Released || r.Assignment.Address != a2.Address {
		t.Fatalf("DEL(c2, enic2) = %+v, %v; want %s released", r, err, a2.Address)
	}
	if _, ok := n.d.store.Holder(a2.Address); ok {
		t.Errorf("%s still held after its pod's DEL", a2.Address)
	}
	n.checkInvariants()
}

// TestStaleRulesRemoved_B13: per-pod policy rules of an address that no pod
// holds and no route leads to (a DEL that released but died before removing
// them) are removed by reconciliation; a held pod's rules are kept.
func TestStaleRulesRemoved_B13(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	host := newMemHost()
	n.host = host
	n.start()
	a1 := n.mustAdd("c1")
	a2 := n.mustAdd("c2")
	host.wire(a2.Address, "enic2")
	host.leaveRules(a1.Address)
	host.leaveRules(a2.Address)
	n.del("c1") // released; the plugin died before removing c1's rules
	n.reconcile()
	left, _ := host.PodRuleAddresses()
	if !slices.Equal(left, []netip.Addr{a2.Address}) {
		t.Errorf("pod rules left for %v, want only the live pod's %s", left, a2.Address)
	}
}

// TestCheckpointKeepsFieldsItDoesNotKnow: a checkpoint carrying a field a
// later build of the same schema version added (as "departed" was added to
// version 1) keeps it through this daemon's restore and its next writes, so
// a rollback to this build and forward again loses nothing.
func TestCheckpointKeepsFieldsItDoesNotKnow(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"IP_COOLDOWN_PERIOD": "30"})
	n.start()
	n.mustAdd("c1")
	n.shutdown()
	path := n.d.cfg.Checkpoint
	st, _, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	const future = `["100.64.0.99"]`
	st.Unknown = map[string]json.RawMessage{"departedLater": json.RawMessage(future)}
	if err := checkpoint.Save(path, st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mustRead(t, path), `"departedLater":`+future) {
		t.Fatalf("test setup: the file lacks the added field: %s", mustRead(t, path))
	}
	n.start()
	n.mustAdd("c2") // a change: the daemon rewrites the file
	n.shutdown()
	if got := mustRead(t, path); !strings.Contains(got, `"departedLater":`+future) || !strings.Contains(got, `"c2"`) {
		t.Errorf("checkpoint rewritten by this daemon dropped a field it does not know (or lacks c2): %s", got)
	}
}

// TestUnwritableCheckpointMakesTheDaemonNotReady: while the checkpoint
// cannot be written (a read-only or full disk), every ADD fails, so the
// daemon reports not ready with the reason (CNI STATUS then fails with 50
// and the readiness probe with 503) rather than ready with ADDs failing;
// once a write succeeds again (the next reconciliation retries it), it is
// ready and ADDs work.
func TestUnwritableCheckpointMakesTheDaemonNotReady(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	n.mustAdd("c1")
	n.setSave(func(string, checkpoint.State) error { return fmt.Errorf("open checkpoint: read-only file system") })
	if _, err := n.add("c2"); err == nil {
		t.Fatal("ADD succeeded with an unwritable checkpoint")
	}
	st := n.status()
	if st.Ready || !strings.Contains(st.Reason, "read-only file system") || !strings.Contains(st.Reason, "every ADD fails") {
		t.Errorf("status with an unwritable checkpoint: ready %v, reason %q; want not ready naming the failure", st.Ready, st.Reason)
	}
	n.setSave(checkpoint.Save)
	n.reconcile()
	if st := n.status(); !st.Ready || st.Reason != "" {
		t.Errorf("status after the checkpoint was written again: ready %v, reason %q; want ready", st.Ready, st.Reason)
	}
	n.mustAdd("c2")
}

// TestUnwritableCheckpointRecoversOnAQuietNode: a node made not ready by an
// unwritable checkpoint gets no ADD (the runtime sees CNI STATUS fail), so
// nothing else writes it: the reconciliation's tick does, in both modes,
// and the node is ready again once the disk allows (found by review).
func TestUnwritableCheckpointRecoversOnAQuietNode(t *testing.T) {
	for name, env := range map[string]map[string]string{"ipv4": {}, "ipv6": ipv6Env()} {
		t.Run(name, func(t *testing.T) {
			env["VPCIP_RECONCILE_INTERVAL"] = "20ms"
			c := startCloud(t)
			n := newNode(t, c, itypeSmall, env)
			n.start()
			n.mustAdd("c1")
			n.setSave(func(string, checkpoint.State) error { return fmt.Errorf("read-only file system") })
			if _, err := n.add("c2"); err == nil {
				t.Fatal("ADD succeeded with an unwritable checkpoint")
			}
			n.setSave(checkpoint.Save)
			eventually(t, "ready again without an ADD", func() bool { return n.status().Ready })
		})
	}
}

// setSave replaces the daemon's checkpoint write (checkpoint.Save).
func (n *node) setSave(save func(string, checkpoint.State) error) {
	n.d.ckpt.mu.Lock()
	n.d.ckpt.save = save
	n.d.ckpt.mu.Unlock()
}
