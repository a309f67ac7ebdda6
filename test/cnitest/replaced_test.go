package cnitest

import (
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vpcip/vpcip/ipamd/api"
)

// TestReplacedSandboxLeavesNoRules: a new sandbox of the same pod (same
// host veth name) ADDed while the old sandbox's veth exists replaces it
// and releases the old address; the old address keeps neither a route
// nor policy rules in the node netns (a released address may go to any
// pod, B13). They are gone already when the release reaches the daemon:
// removed after it, they could be the next owner's.
func TestReplacedSandboxLeavesNoRules(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	old := e.NewPod(t, "recreated")
	e.MustAdd(t, old)
	if got, want := PodRules(t, e.Node.Name, old.Address), WantRules(old.Address, 2); !slices.Equal(got, want) {
		t.Fatalf("setup: rules of the old sandbox %v, want %v", got, want)
	}
	var mu sync.Mutex
	var atRelease []string
	released := false
	d.BeforeRelease(func(r api.ReleaseRequest) {
		if r.Key != e.key(old) {
			return
		}
		rs := PodRules(t, e.Node.Name, old.Address)
		mu.Lock()
		defer mu.Unlock()
		atRelease, released = rs, true
	})
	nu := sameSandboxPod(t, e, old)
	e.MustAdd(t, nu)
	d.BeforeRelease(nil)
	mu.Lock()
	if !released {
		t.Errorf("the replacing ADD did not release the old sandbox %s", e.key(old))
	} else if len(atRelease) != 0 {
		t.Errorf("rules of %v still present when its release reached the daemon: %v", old.Address, atRelease)
	}
	mu.Unlock()
	if _, held := d.Held()[e.key(old)]; held {
		t.Errorf("the replaced sandbox still holds %v", old.Address)
	}
	a := mustHeld(t, e, nu)
	AssertPodWired(t, e, nu, a.RouteTable, mtuOf(e, a))
	if r, ok := HostRoute(t, e.Node.Name, old.Address); ok {
		t.Errorf("released %v still routed: %+v", old.Address, r)
	}
	if rs := PodRules(t, e.Node.Name, old.Address); len(rs) != 0 {
		t.Errorf("released %v (the replaced sandbox's) keeps its rules in the node: %v", old.Address, rs)
	}
	mustDel(t, e, nu)
	AssertNodeClean(t, e)
}

// TestReplacedAddressGoesToAnotherPodAtOnce: the old sandbox's address is
// handed to another pod the moment the daemon records its release (no
// cooldown), and that pod is wired before the replacing ADD has its
// answer. The replacing ADD must not touch the address after releasing it:
// the other pod keeps its route and exactly its rules.
func TestReplacedAddressGoesToAnotherPodAtOnce(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool()) // old: .10, new sandbox: .11, then .10 again
	e.Chain = false
	old := e.NewPod(t, "recreated")
	e.MustAdd(t, old)
	next := e.NewPod(t, "next")
	nextDone := make(chan error, 1)
	d.AfterRelease(func(r api.ReleaseRequest) {
		if r.Key == e.key(old) {
			nextDone <- e.Add(t, next)
		}
	})
	nu := sameSandboxPod(t, e, old)
	e.MustAdd(t, nu)
	d.AfterRelease(nil)
	var nextErr error
	select {
	case nextErr = <-nextDone:
	default:
		t.Fatalf("the replacing ADD did not release the old sandbox %s", e.key(old))
	}
	if nextErr != nil {
		t.Fatalf("ADD of the next pod while the old sandbox's release was answered: %v", nextErr)
	}
	if next.Address != old.Address {
		t.Fatalf("setup: the next pod got %v, want the released %v", next.Address, old.Address)
	}
	for _, p := range []*Pod{next, nu} {
		a := mustHeld(t, e, p)
		AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
	}
	mustDel(t, e, nu)
	mustDel(t, e, next)
	AssertNodeClean(t, e)
}

// TestReplacedSandboxDaemonDown: with vpcipd unreachable, the replacing
// ADD fails (code 11) but the old sandbox's veth, route and rules are gone
// all the same; its address stays held (nothing released it) and carries
// no rule when its stale DEL releases it later.
func TestReplacedSandboxDaemonDown(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	old := e.NewPod(t, "recreated")
	e.MustAdd(t, old)
	d.Stop(t)
	nu := sameSandboxPod(t, e, old)
	err := e.Add(t, nu)
	if CNICode(err) != types.ErrTryAgainLater {
		t.Errorf("ADD with the daemon down: %v, want code 11", err)
	}
	if rs := PodRules(t, e.Node.Name, old.Address); len(rs) != 0 {
		t.Errorf("rules of the replaced sandbox's %v left: %v", old.Address, rs)
	}
	if r, ok := HostRoute(t, e.Node.Name, old.Address); ok {
		t.Errorf("%v still routed: %+v", old.Address, r)
	}
	d.Start(t)
	if _, held := d.Held()[e.key(old)]; !held {
		t.Errorf("the old sandbox's %v was released though no release reached the daemon", old.Address)
	}
	e.MustAdd(t, nu)
	a := mustHeld(t, e, nu)
	AssertPodWired(t, e, nu, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, old) // the runtime's late DEL of the old sandbox
	if _, held := d.Held()[e.key(old)]; held {
		t.Errorf("old sandbox still held after its DEL")
	}
	a = mustHeld(t, e, nu)
	AssertPodWired(t, e, nu, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, nu)
	AssertNodeClean(t, e)
}

// TestReplacedUnmarkedVeth: the old veth carries no sandbox alias (made
// before veths were marked), so the replacing ADD cannot release its
// address by key; its route and rules go with the veth all the same, and
// the address stays held until its own DEL (or GC).
func TestReplacedUnmarkedVeth(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	old := e.NewPod(t, "unmarked")
	e.MustAdd(t, old)
	ipCmd(t, "-n", e.Node.Name, "link", "set", "dev", e.HostVeth(old), "alias", "")
	nu := sameSandboxPod(t, e, old)
	e.MustAdd(t, nu)
	if rs := PodRules(t, e.Node.Name, old.Address); len(rs) != 0 {
		t.Errorf("rules of the unmarked veth's %v left: %v", old.Address, rs)
	}
	if _, held := d.Held()[e.key(old)]; !held {
		t.Errorf("the unmarked veth's sandbox lost its address without its key being named")
	}
	a := mustHeld(t, e, nu)
	AssertPodWired(t, e, nu, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, old)
	mustDel(t, e, nu)
	AssertNodeClean(t, e)
}

// secondaryENIPool is two addresses on the ENI at device 1 (table 2), so
// a pod has rules at both priorities.
func secondaryENIPool() []FakeAddress {
	return []FakeAddress{
		{Addr: netip.MustParseAddr("100.64.2.10"), DeviceNumber: 1},
		{Addr: netip.MustParseAddr("100.64.2.11"), DeviceNumber: 1},
	}
}
