package cnitest

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/ipamd/api"
)

// TestAddPodNetnsDeletedWhileAssigning: the runtime removes the pod netns
// while the ADD waits for the daemon (after the plugin opened its netlink
// session and made the pair). Whatever the ADD answers, the node is left
// clean: a failed ADD releases and undoes; a successful one is followed by
// the runtime's DEL, which cleans up.
func TestAddPodNetnsDeletedWhileAssigning(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(4))
	e.Chain = false
	p := e.NewPod(t, "vanish")
	d.BeforeAssign(func(api.AssignRequest) {
		time.Sleep(200 * time.Millisecond) // the pair is made meanwhile
		DeleteNetns(p.NetnsName)
	})
	err := e.Add(t, p)
	d.BeforeAssign(nil)
	_, held := e.Held(t, p)
	t.Logf("ADD after the netns was deleted: err %v; address held %v", err, held)
	if err != nil {
		if held {
			t.Errorf("failed ADD left its address held")
		}
		AssertNodeClean(t, e)
		return
	}
	// The netns lived on through the plugin's descriptors only; the kernel
	// frees it (and the veth pair) after the plugin exits.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := linkNamed(t, e.Node.Name, e.HostVeth(p)); !ok {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after the plugin exited: host veth %v, route %v, rules %v", present(linkNamed(t, e.Node.Name, e.HostVeth(p))),
		present(HostRoute(t, e.Node.Name, p.Address)), PodRules(t, e.Node.Name, p.Address))
	if err := e.Del(t, p); err != nil {
		t.Errorf("DEL: %v", err)
	}
	if _, held := e.Held(t, p); held {
		t.Errorf("address held after DEL")
	}
	AssertNodeClean(t, e)
}

func present[T any](_ T, ok bool) bool { return ok }

// TestAddReplacesStaleRulesOfItsAddress (B28): rules an earlier owner of
// the address left in the node netns, at both priorities and pointing at
// other tables, are replaced by exactly the pod's, for an address on the
// primary ENI (main table) and one on a secondary ENI.
func TestAddReplacesStaleRulesOfItsAddress(t *testing.T) {
	RequireRoot(t)
	pool := FakePool(2)
	e, _ := fakeEnv(t, pool)
	e.Chain = false
	for _, fa := range pool {
		a := fa.Addr.String()
		ipCmd(t, "-n", e.Node.Name, "rule", "add", "priority", "512", "to", a+"/32", "lookup", "9")
		ipCmd(t, "-n", e.Node.Name, "rule", "add", "priority", "1536", "from", a+"/32", "lookup", "7")
	}
	var pods []*Pod
	for range pool {
		p := e.NewPod(t, "stale")
		e.MustAdd(t, p)
		a := mustHeld(t, e, p)
		AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
		pods = append(pods, p)
	}
	for _, p := range pods {
		mustDel(t, e, p)
	}
	AssertNodeClean(t, e)
}

// TestReplacedSandboxLeavesNoRulesVpcipd: with the real daemon, the
// replacing ADD of a new sandbox of the same pod releases the old
// sandbox's address and leaves none of its rules behind, without help from
// vpcipd's host check (at its default interval, 1 min, it does not run
// during the test).
func TestReplacedSandboxLeavesNoRulesVpcipd(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	e := NewEnv(t, v.nodes[0], v.daemons[0])
	e.Chain = false
	old := e.NewPod(t, "recreated")
	e.MustAdd(t, old)
	if rs := PodRules(t, e.Node.Name, old.Address); len(rs) == 0 {
		t.Fatalf("setup: the old sandbox's %v has no rules", old.Address)
	}
	nu := sameSandboxPod(t, e, old)
	e.MustAdd(t, nu)
	if rs := PodRules(t, e.Node.Name, old.Address); len(rs) != 0 {
		t.Errorf("right after the replacing ADD, rules of the old sandbox's %v: %v", old.Address, rs)
	}
	if _, held := e.Held(t, old); held {
		t.Errorf("the old sandbox still holds %v", old.Address)
	}
	a := mustHeld(t, e, nu)
	AssertPodWired(t, e, nu, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, nu)
	AssertNodeClean(t, e)
}

// TestConcurrentAddsWithRuleChurn: the suite's 30 concurrent ADDs and DELs
// while other policy rules of the node netns are added and removed without
// pause (each ADD lists the rules to replace stale ones of its address).
func TestConcurrentAddsWithRuleChurn(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool(64))
	stop, done := make(chan struct{}), make(chan struct{})
	churned := 0
	go func() {
		defer close(done)
		runtime.LockOSThread() // left locked: the thread ends with the goroutine
		if err := e.Node.NS.Set(); err != nil {
			t.Error(err)
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := netlink.NewRule()
			r.Priority, r.Table = 2000+i%64, 100
			r.Src = &net.IPNet{IP: net.IPv4(10, 9, byte(i%64), 1).To4(), Mask: net.CIDRMask(32, 32)}
			if netlink.RuleAdd(r) == nil && netlink.RuleDel(r) == nil {
				churned++
			}
		}
	}()
	testConcurrentAdds(t, e)
	close(stop)
	<-done
	t.Logf("%d rules added and removed meanwhile", churned)
	if churned == 0 {
		t.Error("no rule churn happened")
	}
	AssertNodeClean(t, e)
}
