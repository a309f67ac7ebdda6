package cnitest

import (
	"net/netip"
	"testing"
)

// TestReplacedSandboxLeavesNoRules: a new sandbox of the same pod (same
// host veth name) ADDed while the old sandbox's veth exists replaces it
// and releases the old address; the old address keeps neither a route
// nor policy rules in the node netns (a released address may go to any
// pod, B13).
func TestReplacedSandboxLeavesNoRules(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, []FakeAddress{
		{Addr: netip.MustParseAddr("100.64.2.10"), DeviceNumber: 1},
		{Addr: netip.MustParseAddr("100.64.2.11"), DeviceNumber: 1},
	})
	e.Chain = false
	old := e.NewPod(t, "recreated")
	e.MustAdd(t, old)
	nu := sameSandboxPod(t, e, old)
	e.MustAdd(t, nu)
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
