package cnitest

import (
	"testing"
)

// A crash-looping pod whose sandboxes are recreated without a DEL (kubelet
// after a runtime restart) while the old netns stays: each ADD replaces the
// old sandbox's veth, which took its pod interface with it, so the old
// sandbox's address is given back at once instead of piling up until GC
// (issue kind 5).
func TestRecreatedSandboxesDoNotPileUpAddresses(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	e := NewEnv(t, v.nodes[0], v.daemons[0])
	e.Chain = false
	first := e.NewPod(t, "crashloop")
	e.MustAdd(t, first)
	sandboxes := []*Pod{first}
	for range 15 {
		s := sameSandboxPod(t, e, first)
		e.MustAdd(t, s)
		sandboxes = append(sandboxes, s)
	}
	last := sandboxes[len(sandboxes)-1]
	held := 0
	for _, s := range sandboxes[:len(sandboxes)-1] {
		if a, ok := e.Held(t, s); ok {
			held++
			t.Logf("replaced sandbox %s still holds %v", s.ContainerID[:12], a.Address)
		}
	}
	if held > 0 {
		t.Errorf("%d of %d replaced sandboxes still hold an address", held, len(sandboxes)-1)
	}
	a := mustHeld(t, e, last)
	AssertPodWired(t, e, last, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, last)
}
