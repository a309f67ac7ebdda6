package cnitest

import (
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vpcip/vpcip/ipamd/api"
)

// hostState is what the node netns holds of one attachment.
type hostState struct {
	veth  bool
	route bool
	rules []string
}

func (h hostState) empty() bool { return !h.veth && !h.route && len(h.rules) == 0 }

func hostStateOf(t testing.TB, e *Env, p *Pod) hostState {
	_, veth := linkNamed(t, e.Node.Name, e.HostVeth(p))
	_, route := HostRoute(t, e.Node.Name, p.Address)
	return hostState{veth: veth, route: route, rules: PodRules(t, e.Node.Name, p.Address)}
}

// lostPod ADDs a pod whose result the runtime then loses (its own cache
// dir): libcni's GC has no cached attachment to DEL for it, so only the
// plugin's GC can release it.
func lostPod(t *testing.T, e *Env, name string) *Pod {
	t.Helper()
	lost := *e
	lost.CacheDir = t.TempDir()
	p := lost.NewPod(t, name)
	lost.MustAdd(t, p)
	return p
}

// dropSandbox removes p's sandbox without a DEL, as a runtime that lost it
// does: its netns goes, and its host veth and route with it (deleted here
// rather than left to the kernel's asynchronous netns teardown); the
// policy rules stay.
func dropSandbox(t *testing.T, e *Env, p *Pod) {
	t.Helper()
	DeleteNetns(p.NetnsName)
	_ = exec.Command("ip", "-n", e.Node.Name, "link", "del", e.HostVeth(p)).Run() // gone already: fine
	if got := hostStateOf(t, e, p); got.veth || got.route || len(got.rules) != 2 {
		t.Fatalf("setup: host state of the dropped sandbox %+v, want its 2 rules only", got)
	}
}

// TestGCRemovesHostStateBeforeRelease: GC removes a stale attachment's
// host veth, route and policy rules before its release reaches the daemon,
// whether its sandbox netns is still there or already gone (veth and route
// went with it, the rules stay). Removed after the release, they could be
// those of the next pod given the address (B13).
func TestGCRemovesHostStateBeforeRelease(t *testing.T) {
	RequireRoot(t)
	for _, sandboxGone := range []bool{false, true} {
		name := "netns kept"
		if sandboxGone {
			name = "netns gone"
		}
		t.Run(name, func(t *testing.T) {
			e, d := fakeEnv(t, secondaryENIPool())
			e.Chain = false
			stale := lostPod(t, e, "stale")
			if got := hostStateOf(t, e, stale); !got.route || len(got.rules) != 2 {
				t.Fatalf("setup: host state of the stale pod %+v, want a route and 2 rules", got)
			}
			if sandboxGone {
				dropSandbox(t, e, stale)
			}
			var mu sync.Mutex
			var atRelease *hostState
			d.BeforeRelease(func(r api.ReleaseRequest) {
				if r.Key != e.key(stale) {
					return
				}
				h := hostStateOf(t, e, stale)
				mu.Lock()
				defer mu.Unlock()
				atRelease = &h
			})
			if err := e.GC(t); err != nil {
				t.Fatalf("GC: %v", err)
			}
			d.BeforeRelease(nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case atRelease == nil:
				t.Errorf("GC did not release %s", e.key(stale))
			case !atRelease.empty():
				t.Errorf("host state of %v when its release reached the daemon: %+v, want none", stale.Address, *atRelease)
			}
			if _, held := d.Held()[e.key(stale)]; held {
				t.Errorf("GC left %v held", stale.Address)
			}
			AssertHostSideGone(t, e, stale, stale.Address)
			AssertNodeClean(t, e)
		})
	}
}

// TestGCAddressGoesToAnotherPodAtOnce: the address GC releases is handed
// to another pod the moment the daemon records it, and that pod is wired
// before the GC has its answer: the GC must not touch the address after
// releasing it, so the other pod keeps its route and both rules.
func TestGCAddressGoesToAnotherPodAtOnce(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	stale := lostPod(t, e, "stale") // .10
	keep := e.NewPod(t, "keep")     // .11
	e.MustAdd(t, keep)
	dropSandbox(t, e, stale)
	next := e.NewPod(t, "next")
	var nextErr error
	added := false
	d.AfterRelease(func(r api.ReleaseRequest) {
		if r.Key == e.key(stale) {
			nextErr, added = e.Add(t, next), true
		}
	})
	if err := e.GC(t, keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	d.AfterRelease(nil)
	if !added || nextErr != nil {
		t.Fatalf("ADD of the next pod as the GC's release was recorded: added %v, %v", added, nextErr)
	}
	if next.Address != stale.Address {
		t.Fatalf("setup: the next pod got %v, want the released %v", next.Address, stale.Address)
	}
	for _, p := range []*Pod{keep, next} {
		a := mustHeld(t, e, p)
		AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
	}
	mustDel(t, e, next)
	mustDel(t, e, keep)
	AssertNodeClean(t, e)
}

// TestGCKeepsWhatItCouldNotClean: a stale attachment whose host state GC
// cannot remove (here its route leads to a non-veth link named as its
// host veth, a bridge the plugin refuses to delete) stays held, and the GC
// fails (code 999) naming it; the other stale attachment is released. The
// next GC, once the link is gone, releases it.
func TestGCKeepsWhatItCouldNotClean(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	stuck, other := lostPod(t, e, "stuck"), lostPod(t, e, "other")
	dropSandbox(t, e, stuck)
	veth := e.HostVeth(stuck)
	ipCmd(t, "-n", e.Node.Name, "link", "add", veth, "type", "bridge")
	ipCmd(t, "-n", e.Node.Name, "link", "set", veth, "up")
	ipCmd(t, "-n", e.Node.Name, "route", "replace", stuck.Address.String()+"/32", "dev", veth, "scope", "link")
	err := e.GC(t)
	if CNICode(err) != types.ErrInternal || !strings.Contains(err.Error(), e.key(stuck).String()) {
		t.Errorf("GC with host state it cannot remove: %v (code %d), want code 999 naming %s", err, CNICode(err), e.key(stuck))
	}
	held := d.Held()
	if _, ok := held[e.key(stuck)]; !ok {
		t.Errorf("GC released %v though its host state could not be removed", stuck.Address)
	}
	if _, ok := held[e.key(other)]; ok {
		t.Errorf("GC kept %v, whose host state it removed", other.Address)
	}
	AssertHostSideGone(t, e, other, other.Address)
	ipCmd(t, "-n", e.Node.Name, "link", "del", veth)
	if err := e.GC(t); err != nil {
		t.Fatalf("second GC: %v", err)
	}
	if _, ok := d.Held()[e.key(stuck)]; ok {
		t.Errorf("second GC left %v held", stuck.Address)
	}
	AssertNodeClean(t, e)
}

// TestGCWithADaemonWithoutPlan: against a daemon that predates
// /v1/gc/plan, GC still releases the stale attachment (in one step, as
// before) and removes its host state.
func TestGCWithADaemonWithoutPlan(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	d.WithoutGCPlan()
	stale := lostPod(t, e, "stale")
	keep := e.NewPod(t, "keep")
	e.MustAdd(t, keep)
	if err := e.GC(t, keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, held := d.Held()[e.key(stale)]; held {
		t.Errorf("GC left %v held", stale.Address)
	}
	if got := d.Calls("/v1/gc"); got != 1 {
		t.Errorf("one-step GC calls: %d, want 1", got)
	}
	AssertHostSideGone(t, e, stale, stale.Address)
	a := mustHeld(t, e, keep)
	AssertPodWired(t, e, keep, a.RouteTable, mtuOf(e, a))
	if rs := PodRules(t, e.Node.Name, keep.Address); !slices.Equal(rs, WantRules(keep.Address, a.RouteTable)) {
		t.Errorf("rules of the valid pod: %v", rs)
	}
	mustDel(t, e, keep)
	AssertNodeClean(t, e)
}

// TestGCKeepsAddressRoutedToAnotherSandbox: a stale attachment whose
// address the host routes to another sandbox's veth (a conflict: that
// sandbox sends from it) is not released by GC, which would hand the
// address to a third pod; the GC fails (code 999) naming it, and the other
// sandbox's wiring is untouched. Once the route is gone, the next GC
// releases it. Before, GC logged "leaving its host state alone" and
// released the address anyway.
func TestGCKeepsAddressRoutedToAnotherSandbox(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	stale := lostPod(t, e, "stale")
	keep := e.NewPod(t, "keep")
	e.MustAdd(t, keep)
	ipCmd(t, "-n", e.Node.Name, "route", "replace", stale.Address.String()+"/32", "dev", e.HostVeth(keep), "scope", "link")
	err := e.GC(t, keep)
	if CNICode(err) != types.ErrInternal || !strings.Contains(err.Error(), e.key(stale).String()) || !strings.Contains(err.Error(), "another sandbox") {
		t.Errorf("GC of an address routed to another sandbox: %v (code %d), want code 999 naming %s", err, CNICode(err), e.key(stale))
	}
	if _, held := d.Held()[e.key(stale)]; !held {
		t.Errorf("GC released %v though the host routes it to %s", stale.Address, e.HostVeth(keep))
	}
	if _, route := HostRoute(t, e.Node.Name, stale.Address); !route {
		t.Errorf("GC removed the route of %v to the other sandbox", stale.Address)
	}
	a := mustHeld(t, e, keep)
	AssertPodWired(t, e, keep, a.RouteTable, mtuOf(e, a))
	ipCmd(t, "-n", e.Node.Name, "route", "del", stale.Address.String()+"/32")
	DeleteNetns(stale.NetnsName) // its sandbox goes too, with its own veth
	_ = exec.Command("ip", "-n", e.Node.Name, "link", "del", e.HostVeth(stale)).Run()
	if err := e.GC(t, keep); err != nil {
		t.Fatalf("GC once the conflicting route is gone: %v", err)
	}
	if _, held := d.Held()[e.key(stale)]; held {
		t.Errorf("GC left %v held once its route was gone", stale.Address)
	}
	mustDel(t, e, keep)
	AssertNodeClean(t, e)
}

// TestGCSkipsWhatWasReleasedSinceItsPlan: a stale attachment that vpcipd
// released while the GC was under way (its own check that the pod is gone),
// and whose address a new sandbox then took, is nothing to collect: the GC
// succeeds and leaves the new sandbox's wiring alone. Before, it failed
// (code 999) claiming the attachment was kept for the next GC.
func TestGCSkipsWhatWasReleasedSinceItsPlan(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	stale := lostPod(t, e, "stale")
	keep := e.NewPod(t, "keep")
	e.MustAdd(t, keep)
	d.AfterGCPlan(func() {
		d.Release(e.key(stale))
		// The address's next holder is wired to its own veth (keep's here).
		ipCmd(t, "-n", e.Node.Name, "route", "replace", stale.Address.String()+"/32", "dev", e.HostVeth(keep), "scope", "link")
	})
	if err := e.GC(t, keep); err != nil {
		t.Errorf("GC with a stale attachment released since its plan: %v (code %d), want success", err, CNICode(err))
	}
	d.AfterGCPlan(nil)
	if _, route := HostRoute(t, e.Node.Name, stale.Address); !route {
		t.Errorf("GC removed the route of %v to its new holder's veth", stale.Address)
	}
	a := mustHeld(t, e, keep)
	AssertPodWired(t, e, keep, a.RouteTable, mtuOf(e, a))
	ipCmd(t, "-n", e.Node.Name, "route", "del", stale.Address.String()+"/32")
	DeleteNetns(stale.NetnsName)
	_ = exec.Command("ip", "-n", e.Node.Name, "link", "del", e.HostVeth(stale)).Run()
	for _, r := range PodRules(t, e.Node.Name, stale.Address) { // "512 to <addr>/32 main"
		f := strings.Fields(r)
		ipCmd(t, "-n", e.Node.Name, "rule", "del", "priority", f[0], f[1], f[2], "lookup", f[3])
	}
	mustDel(t, e, keep)
	AssertNodeClean(t, e)
}

// TestGCWaitsForANewSandboxOfThePod: a GC of a pod's stale sandbox waits
// while an ADD of the pod's new sandbox (the same host veth name) holds the
// pod's lock, so it cannot delete the veth the ADD has just made in place of
// the old one; once the ADD is done, the GC finishes and the new sandbox is
// wired.
func TestGCWaitsForANewSandboxOfThePod(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(4))
	e.Chain = false
	old := lostPod(t, e, "recreated")
	nu := sameSandboxPod(t, e, old)
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.BeforeAssign(func(r api.AssignRequest) {
		if r.Key == e.key(nu) {
			once.Do(func() { close(entered) })
			<-proceed
		}
	})
	added := make(chan error, 1)
	go func() { added <- e.Add(t, nu) }()
	<-entered // the ADD holds the pod's lock, its veth made or being made
	gcDone := make(chan error, 1)
	go func() { gcDone <- e.GC(t, nu) }()
	var gcErr error
	finished := false
	select {
	case gcErr = <-gcDone:
		finished = true
		t.Errorf("GC finished (%v) while the ADD of the pod's new sandbox held the pod's lock", gcErr)
	case <-time.After(time.Second):
	}
	close(proceed)
	if err := <-added; err != nil {
		t.Fatalf("ADD of the new sandbox: %v", err)
	}
	if !finished {
		gcErr = <-gcDone
	}
	if gcErr != nil {
		t.Errorf("GC after the ADD: %v", gcErr)
	}
	d.BeforeAssign(nil)
	if _, held := d.Held()[e.key(old)]; held {
		t.Errorf("the old sandbox still holds %v", old.Address)
	}
	a := mustHeld(t, e, nu)
	AssertPodWired(t, e, nu, a.RouteTable, mtuOf(e, a))
	DeleteNetns(old.NetnsName)
	mustDel(t, e, nu)
	AssertNodeClean(t, e)
}
