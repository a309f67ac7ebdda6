package cnitest

import (
	"net/netip"
	"os/exec"
	"testing"
	"time"
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

// The same crash loop where the runtime also removed each old netns without
// a DEL: no veth is left to replace, so the daemon must find the dead
// sandboxes itself. Their routes are gone and their netns too, which is
// evidence enough even when most of the node's pods are such sandboxes
// (issue kind 5: reconciliation refused to act once more than half the
// assignments lacked a route, and held them indefinitely).
func TestSandboxesDroppedWithoutDELAreReclaimed(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	d := v.daemons[0]
	e := NewEnv(t, v.nodes[0], d)
	e.Chain = false
	prev := e.NewPod(t, "crashloop")
	e.MustAdd(t, prev)
	var dropped []*Pod
	for range 12 {
		DeleteNetns(prev.NetnsName) // runtime restart: the netns goes, no DEL comes
		dropped = append(dropped, prev)
		// The kernel frees the netns, and the veth pair in it, once nothing
		// holds it: do it now, so no ADD sees the old veth.
		if out, err := exec.Command("ip", "-n", e.Node.Name, "link", "del", e.HostVeth(prev)).CombinedOutput(); err != nil {
			t.Logf("old veth: %v: %s", err, out)
		}
		next := sameSandboxPod(t, e, prev)
		e.MustAdd(t, next)
		prev = next
	}
	// A client's SYN to the first dropped sandbox, still tracked.
	client, service := netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("10.96.0.11")
	trackFlow(t, e, client, service, dropped[0].Address, 40100)
	// The daemon restarts (an upgrade) and reconciles every second.
	d.Stop(t)
	d.env = append(d.env, "VPCIP_RECONCILE_INTERVAL=1s", "IP_COOLDOWN_PERIOD=1")
	d.Start(t)
	deadline := time.Now().Add(20*time.Second + realGCGrace) // released past VPCIP_GC_GRACE
	for {
		held := 0
		for _, s := range dropped {
			if _, ok := e.Held(t, s); ok {
				held++
			}
		}
		if held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d dropped sandboxes still hold an address after %v; log:\n%s", held, len(dropped), 20*time.Second+realGCGrace, d.log())
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Its conntrack entries go as its cooldown ends, before it is handed out.
	deadline = time.Now().Add(10 * time.Second)
	for flowsOf(t, e, dropped[0].Address) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d conntrack entries still lead to %v, released by the daemon; log:\n%s", flowsOf(t, e, dropped[0].Address), dropped[0].Address, d.log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	a := mustHeld(t, e, prev)
	AssertPodWired(t, e, prev, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, prev)
}
