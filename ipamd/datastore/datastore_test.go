package datastore

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/provider"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func key(c string) api.Key { return api.Key{Network: "vpcip", ContainerID: c, IfName: "eth0"} }

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// node returns a store with a primary ENI holding .11-.13 and a secondary
// holding .21-.22.
func node(t *testing.T, cooldown time.Duration) *Store {
	t.Helper()
	s := New(cooldown)
	s.Cloud().Sync([]provider.ENI{
		{ID: "eni-a", DeviceNumber: 0, PrimaryIP: netip.MustParseAddr("10.0.0.10"), SecondaryIPs: addrs("10.0.0.11", "10.0.0.12", "10.0.0.13")},
		{ID: "eni-b", DeviceNumber: 1, PrimaryIP: netip.MustParseAddr("10.0.0.20"), SecondaryIPs: addrs("10.0.0.21", "10.0.0.22")},
	}, t0)
	return s
}

func mustAssign(t *testing.T, s *Store, c string, now time.Time) Assignment {
	t.Helper()
	a, _, err := s.Assign(key(c), api.Pod{Namespace: "default", Name: "p-" + c}, now)
	if err != nil {
		t.Fatalf("Assign(%s): %v", c, err)
	}
	return a
}

func TestAssignPrefersPrimaryThenBusiestENI(t *testing.T) {
	s := node(t, 0)
	var got []string
	for i := range 5 {
		got = append(got, mustAssign(t, s, fmt.Sprint("c", i), t0).Address.String())
	}
	want := []string{"10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.21", "10.0.0.22"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("assignment order (-want +got):\n%s", d)
	}
	if _, _, err := s.Assign(key("c9"), api.Pod{}, t0); !errors.Is(err, ErrNoAddress) {
		t.Errorf("Assign on a full pool: err %v, want ErrNoAddress", err)
	}
}

func TestAssignPacksSecondaryENIs(t *testing.T) {
	s := New(0)
	s.Cloud().Sync([]provider.ENI{
		{ID: "eni-a", DeviceNumber: 0},
		{ID: "eni-b", DeviceNumber: 1, SecondaryIPs: addrs("10.0.1.1", "10.0.1.2")},
		{ID: "eni-c", DeviceNumber: 2, SecondaryIPs: addrs("10.0.2.1", "10.0.2.2")},
	}, t0)
	// Occupy one address on eni-c: the next pod goes next to it, keeping eni-b freeable.
	s.Cloud().Sync([]provider.ENI{
		{ID: "eni-a", DeviceNumber: 0},
		{ID: "eni-b", DeviceNumber: 1, SecondaryIPs: addrs("10.0.1.1", "10.0.1.2")},
		{ID: "eni-c", DeviceNumber: 2, SecondaryIPs: addrs("10.0.2.1", "10.0.2.2")},
	}, t0)
	s.Recovery().Recover(map[netip.Addr]string{netip.MustParseAddr("10.0.2.1"): "enixyz"}, t0)
	if a := mustAssign(t, s, "c1", t0); a.Address != netip.MustParseAddr("10.0.2.2") || a.ENIID != "eni-c" || a.DeviceNumber != 2 {
		t.Errorf("got %s on %s (device %d), want 10.0.2.2 on eni-c (device 2)", a.Address, a.ENIID, a.DeviceNumber)
	}
}

func TestAssignIdempotentByKey(t *testing.T) {
	s := node(t, 0)
	a1 := mustAssign(t, s, "c1", t0)
	a2, existing, err := s.Assign(key("c1"), api.Pod{Namespace: "default", Name: "other"}, t0.Add(time.Second))
	if err != nil || !existing || a2.Address != a1.Address || a2.AssignedAt != a1.AssignedAt {
		t.Fatalf("second Assign = %v %v existing=%v, want %v existing", a2.Address, err, existing, a1.Address)
	}
	if n := len(s.Assignments()); n != 1 {
		t.Errorf("%d assignments after two ADDs of one key, want 1", n)
	}
	// Another ifname of the same container is another attachment.
	k := key("c1")
	k.IfName = "net1"
	a3, _, err := s.Assign(k, api.Pod{}, t0)
	if err != nil || a3.Address == a1.Address {
		t.Errorf("Assign(c1/net1) = %v, %v; want a different address", a3.Address, err)
	}
}

func TestReleaseByKeyOnlyAndUnknownKey(t *testing.T) {
	s := node(t, time.Minute)
	a := mustAssign(t, s, "c1", t0)
	mustAssign(t, s, "c2", t0)
	if _, ok := s.Release(key("nobody"), t0); ok {
		t.Error("Release of an unknown key released something")
	}
	other := key("c1")
	other.Network = "othernet"
	if _, ok := s.Release(other, t0); ok {
		t.Error("Release of c1 in another network released c1")
	}
	got, ok := s.Release(key("c1"), t0)
	if !ok || got.Address != a.Address {
		t.Fatalf("Release(c1) = %v %v", got.Address, ok)
	}
	if _, ok := s.Release(key("c1"), t0); ok {
		t.Error("second Release(c1) released again")
	}
	if c := s.Counts(t0); c.Assigned != 1 || c.Cooling != 1 || c.Warm != 3 {
		t.Errorf("counts after release: %+v, want assigned 1 cooling 1 warm 3", c)
	}
}

func TestCooldownHonoured(t *testing.T) {
	s := New(30 * time.Second)
	s.Cloud().Sync([]provider.ENI{{ID: "eni-a", SecondaryIPs: addrs("10.0.0.11", "10.0.0.12")}}, t0)
	a := mustAssign(t, s, "c1", t0)
	mustAssign(t, s, "c2", t0)
	s.Release(key("c1"), t0)
	if _, _, err := s.Assign(key("c3"), api.Pod{}, t0.Add(29*time.Second)); !errors.Is(err, ErrNoAddress) {
		t.Fatalf("Assign within cooldown: err %v, want ErrNoAddress", err)
	}
	got := mustAssign(t, s, "c3", t0.Add(30*time.Second))
	if got.Address != a.Address {
		t.Errorf("after cooldown got %s, want %s", got.Address, a.Address)
	}
}

func TestGCReleasesOnlyUnlistedOldEnough(t *testing.T) {
	s := node(t, 0)
	mustAssign(t, s, "c1", t0)
	mustAssign(t, s, "c2", t0)
	mustAssign(t, s, "young", t0.Add(50*time.Second))
	k := key("c3")
	k.Network = "othernet"
	if _, _, err := s.Assign(k, api.Pod{}, t0); err != nil {
		t.Fatal(err)
	}
	got := s.Collector().GC("vpcip", map[api.Key]bool{key("c1"): true}, time.Minute, t0.Add(70*time.Second))
	if len(got) != 1 || got[0].Key != key("c2") {
		t.Fatalf("GC released %v, want only c2", got)
	}
	for _, c := range []api.Key{key("c1"), key("young"), k} {
		if _, ok := s.Get(c); !ok {
			t.Errorf("GC released %s", c)
		}
	}
}

func TestMarkReleaseNeverTakesAssignedOrCooling(t *testing.T) {
	s := node(t, 30*time.Second)
	mustAssign(t, s, "c1", t0) // .11
	mustAssign(t, s, "c2", t0) // .12
	s.Release(key("c2"), t0)   // .12 cooling
	all := []netip.Prefix{netip.MustParsePrefix("10.0.0.11/32"), netip.MustParsePrefix("10.0.0.12/32"), netip.MustParsePrefix("10.0.0.13/32")}
	got := s.Cloud().MarkRelease("eni-a", all, t0.Add(time.Second))
	if d := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("10.0.0.13/32")}, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Fatalf("MarkRelease (-want +got):\n%s", d)
	}
	// While marked, .13 is never handed out.
	a := mustAssign(t, s, "c3", t0.Add(time.Second))
	if a.Address == netip.MustParseAddr("10.0.0.13") {
		t.Fatal("a slot marked for release was assigned")
	}
	s.Cloud().FinishRelease("eni-a", got, false)
	a4 := mustAssign(t, s, "c4", t0.Add(time.Second))
	if a4.Address != netip.MustParseAddr("10.0.0.13") {
		t.Errorf("after a cancelled release got %s, want 10.0.0.13", a4.Address)
	}
}

func TestMarkDeleteRefusesBusyOrPrimaryENI(t *testing.T) {
	s := node(t, 0)
	if s.Cloud().MarkDelete("eni-a") {
		t.Error("primary ENI marked for deletion")
	}
	s.Recovery().Recover(map[netip.Addr]string{netip.MustParseAddr("10.0.0.21"): "eni1"}, t0)
	if s.Cloud().MarkDelete("eni-b") {
		t.Error("ENI with an assigned address marked for deletion")
	}
	s.Release(api.Key{ContainerID: "recovered:10.0.0.21"}, t0)
	if !s.Cloud().MarkDelete("eni-b") {
		t.Fatal("free ENI not marked")
	}
	for i := range 3 {
		if a, _, err := s.Assign(key(fmt.Sprint("c", i)), api.Pod{}, t0); err == nil && a.ENIID == "eni-b" {
			t.Fatal("address on an ENI being deleted was assigned")
		}
	}
	s.Cloud().FinishDelete("eni-b", true)
	if n := len(s.ENIs()); n != 1 {
		t.Errorf("%d ENIs after delete, want 1", n)
	}
}

func TestSyncNeverForgetsAssignedAddress(t *testing.T) {
	s := node(t, 0)
	a := mustAssign(t, s, "c1", t0) // 10.0.0.11 on eni-a
	r := s.Cloud().Sync([]provider.ENI{
		{ID: "eni-a", DeviceNumber: 0, SecondaryIPs: addrs("10.0.0.12", "10.0.0.14")},
	}, t0)
	if d := cmp.Diff([]netip.Addr{a.Address}, r.KeptAssigned, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
		t.Errorf("KeptAssigned (-want +got):\n%s", d)
	}
	if len(r.ForgottenENIs) != 1 || r.ForgottenENIs[0] != "eni-b" || len(r.AdoptedSlots) != 1 {
		t.Errorf("repairs %+v", r)
	}
	got, ok := s.Get(key("c1"))
	if !ok || got.Address != a.Address || got.ENIID != "" {
		t.Fatalf("c1 after sync: %+v %v; want kept as orphan", got, ok)
	}
	// Released, the orphan is not handed out again: it is not on any ENI.
	s.Release(key("c1"), t0)
	for i := range 3 {
		if b, _, err := s.Assign(key(fmt.Sprint("n", i)), api.Pod{}, t0); err == nil && b.Address == a.Address {
			t.Fatal("an address the cloud no longer shows was assigned")
		}
	}
}

func TestCheckpointRoundTripKeepsCooldown(t *testing.T) {
	s := node(t, 30*time.Second)
	mustAssign(t, s, "c1", t0)
	a2 := mustAssign(t, s, "c2", t0)
	s.Release(key("c2"), t0.Add(time.Second))
	st, _ := s.Recovery().Checkpoint(t0.Add(2 * time.Second))
	if len(st.Assignments) != 1 || len(st.Cooling) != 1 || st.Cooling[0].Address != a2.Address {
		t.Fatalf("checkpoint %+v", st)
	}
	r := New(30 * time.Second)
	if err := r.Recovery().Restore(st); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Assign(key("c3"), api.Pod{}, t0); !errors.Is(err, ErrNoAddress) {
		t.Errorf("Assign before the first sync: %v, want ErrNoAddress", err)
	}
	r.Cloud().Sync([]provider.ENI{{ID: "eni-a", SecondaryIPs: addrs("10.0.0.11", "10.0.0.12")}}, t0)
	if _, _, err := r.Assign(key("c3"), api.Pod{}, t0.Add(10*time.Second)); !errors.Is(err, ErrNoAddress) {
		t.Errorf("Assign within the restored cooldown: %v, want ErrNoAddress", err)
	}
	if a := mustAssign(t, r, "c3", t0.Add(31*time.Second)); a.Address != a2.Address {
		t.Errorf("after cooldown got %s, want %s", a.Address, a2.Address)
	}
	if got, ok := r.Get(key("c1")); !ok || got.ENIID != "eni-a" {
		t.Errorf("restored c1 = %+v %v", got, ok)
	}
}

func TestPrefixSlotsExpandAndPack(t *testing.T) {
	s := New(0)
	s.Cloud().Sync([]provider.ENI{{ID: "eni-a", Prefixes: []netip.Prefix{
		netip.MustParsePrefix("10.0.0.16/28"), netip.MustParsePrefix("10.0.0.32/28")}}}, t0)
	if c := s.Counts(t0); c.Warm != 32 || c.Slots != 2 {
		t.Fatalf("counts %+v, want 32 warm in 2 slots", c)
	}
	for i := range 17 {
		mustAssign(t, s, fmt.Sprint("c", i), t0)
	}
	snap := s.Snapshot(t0)
	if len(snap) != 1 || len(snap[0].Slots) != 2 || snap[0].Slots[0].Assigned != 16 || snap[0].Slots[1].Assigned != 1 {
		t.Errorf("snapshot %+v, want first /28 full and one in the second", snap)
	}
}

// TestAssignKeepsACohortInItsSlot: a rollout on a node in prefix mode. A
// /28 is full of the old pods, assigned an hour ago; the first 2 new pods
// went to a second /28 (the first was full), then 4 old pods stop. The
// next 6 new pods, within CohortWindow, join their cohort's /28, not the
// holes of the busier old one, so once the other old pods stop their /28
// is empty and can be released whole. Past CohortWindow of any
// assignment a pod fills the busiest /28, as before.
func TestAssignKeepsACohortInItsSlot(t *testing.T) {
	a, b := netip.MustParsePrefix("10.0.0.16/28"), netip.MustParsePrefix("10.0.0.32/28")
	sync := func() *Store {
		s := New(0)
		s.Cloud().Sync([]provider.ENI{{ID: "eni-a", Prefixes: []netip.Prefix{a, b}}}, t0)
		for i := range 16 {
			mustAssign(t, s, fmt.Sprint("old", i), t0)
		}
		return s
	}
	s := sync()
	rollout := t0.Add(time.Hour)
	for i := range 2 {
		if got := mustAssign(t, s, fmt.Sprint("new", i), rollout).Address; !b.Contains(got) {
			t.Fatalf("new pod %d got %s, want the second /28 (the first is full)", i, got)
		}
	}
	for i := range 4 {
		if _, ok := s.Release(key(fmt.Sprint("old", i)), rollout); !ok {
			t.Fatalf("release old%d", i)
		}
	}
	for i := 2; i < 8; i++ {
		if got := mustAssign(t, s, fmt.Sprint("new", i), rollout.Add(20*time.Second)).Address; !b.Contains(got) {
			t.Errorf("new pod %d got %s, want its cohort's /28 %s, not a hole of the busier %s", i, got, b, a)
		}
	}
	for i := 4; i < 16; i++ {
		s.Release(key(fmt.Sprint("old", i)), rollout.Add(35*time.Second))
	}
	for _, e := range s.Snapshot(rollout.Add(time.Minute)) {
		for _, sl := range e.Slots {
			if sl.Prefix == a && sl.Assigned != 0 {
				t.Errorf("after the old pods stopped, their /28 holds %d; want none (releasable whole)", sl.Assigned)
			}
		}
	}
	// The busiest /28 (12 old pods) and one holding 2 pods of an hour
	// later: within CohortWindow of those 2 the next pod joins them, past
	// it the busiest /28, and so with a clock stepped back before them.
	for _, c := range []struct {
		after time.Duration
		want  netip.Prefix
	}{{2 * time.Second, b}, {CohortWindow + time.Second, a}} {
		s := sync()
		for i := range 2 {
			mustAssign(t, s, fmt.Sprint("new", i), rollout)
		}
		for i := range 4 {
			s.Release(key(fmt.Sprint("old", i)), rollout)
		}
		if got := mustAssign(t, s, "next", rollout.Add(c.after)).Address; !c.want.Contains(got) {
			t.Errorf("a pod %v after the 2 in %s got %s, want %s", c.after, b, got, c.want)
		}
	}
	s = sync()
	for i := range 2 {
		mustAssign(t, s, fmt.Sprint("new", i), rollout.Add(10*time.Minute))
	}
	for i := range 4 {
		s.Release(key(fmt.Sprint("old", i)), rollout)
	}
	if got := mustAssign(t, s, "next", rollout.Add(2*time.Second)).Address; !a.Contains(got) {
		t.Errorf("a pod before the 2 in %s (clock stepped back) got %s, want the busiest %s", b, got, a)
	}
}

// TestAssignPrefersAPrefixToSingleAddresses: an ENI holding single
// addresses (prefix mode's no-/28 fallback) and an empty /28 at a higher
// address: pods get the /28's addresses, so the single ones stay free to
// be released.
func TestAssignPrefersAPrefixToSingleAddresses(t *testing.T) {
	s := New(0)
	s.Cloud().Sync([]provider.ENI{{ID: "eni-a", SecondaryIPs: addrs("10.0.0.5", "10.0.0.6"),
		Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.32/28")}}}, t0)
	for i := range 3 {
		if a := mustAssign(t, s, fmt.Sprint("c", i), t0); !netip.MustParsePrefix("10.0.0.32/28").Contains(a.Address) {
			t.Fatalf("pod %d got %s, want an address of the /28", i, a.Address)
		}
	}
}

// TestGCInTwoSteps: Stale lists what GC would release and releases
// nothing; GCOnly releases only the listed keys still holding the listed
// address and still stale; an empty list releases nothing.
func TestGCInTwoSteps(t *testing.T) {
	s := node(t, 0)
	a1 := mustAssign(t, s, "c1", t0)
	a2 := mustAssign(t, s, "c2", t0)
	mustAssign(t, s, "young", t0.Add(50*time.Second))
	now := t0.Add(70 * time.Second)
	none := map[api.Key]bool{}
	stale := s.Collector().Stale("vpcip", none, time.Minute, now)
	if len(stale) != 2 || stale[0].Key != key("c1") || stale[1].Key != key("c2") {
		t.Fatalf("Stale = %v, want c1 and c2", stale)
	}
	if len(s.Assignments()) != 3 {
		t.Fatalf("Stale released something: %v", s.Assignments())
	}
	if got := s.Collector().GCOnly("vpcip", none, time.Minute, now, map[api.Key]netip.Addr{}); len(got) != 0 {
		t.Errorf("GCOnly with an empty list released %v", got)
	}
	if got := s.Collector().GCOnly("vpcip", none, time.Minute, now, nil); len(got) != 0 {
		t.Errorf("GCOnly with no list released %v", got)
	}
	only := map[api.Key]netip.Addr{key("c1"): a2.Address, key("c2"): a2.Address, key("young"): mustGet(t, s, "young").Address}
	got := s.Collector().GCOnly("vpcip", none, time.Minute, now, only)
	if len(got) != 1 || got[0].Key != key("c2") {
		t.Errorf("GCOnly = %v, want c2 only (c1 holds another address, young is within grace)", got)
	}
	if _, ok := s.Get(key("c1")); !ok {
		t.Errorf("GCOnly released c1 (%v), listed with another address", a1.Address)
	}
}

func mustGet(t *testing.T, s *Store, c string) Assignment {
	t.Helper()
	a, ok := s.Get(key(c))
	if !ok {
		t.Fatalf("no assignment for %s", c)
	}
	return a
}
