package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/routing"
	"github.com/vpcip/vpcip/test/netnsdir"
)

// addThrough wires a as ADD does through one Session: the pair with its
// alias (returning the replaced veth's), then Configure.
func addThrough(t *testing.T, s *Session, node ns.NetNS, a Attachment, alias string) (string, Replaced, error) {
	t.Helper()
	replaced, err := s.CreatePair(node, a.HostVeth, a.IfName, a.MTU, alias)
	if err != nil {
		return replaced.Alias, replaced, err
	}
	_, err = s.Configure(a)
	return replaced.Alias, replaced, err
}

// assertHostClean: no host veth, host route or pod rule of a is left.
func assertHostClean(t *testing.T, a Attachment) {
	t.Helper()
	if rs, _ := routing.FindPodRules(a.PodIP); len(rs) != 0 {
		t.Errorf("rules left: %v", rs)
	}
	if l, _ := HostRouteLink(a.PodIP); l != "" {
		t.Errorf("host route left via %s", l)
	}
	if _, err := netlinksafe.LinkByName(a.HostVeth); err == nil {
		t.Errorf("host veth %s left", a.HostVeth)
	}
}

// TestSessionRetriedADD: a retried ADD of the same container through one
// session (and through a second one) converges: the pair is replaced, the
// alias kept, exactly the pod's rules present, Check passes.
func TestSessionRetriedADD(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(3)
		s, err := Open(pod)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if prev, replaced, err := addThrough(t, s, node, a, "sandbox-1"); err != nil || replaced.Veth || prev != "" {
			t.Fatalf("first ADD: prev %q replaced %+v err %v", prev, replaced, err)
		}
		if prev, replaced, err := addThrough(t, s, node, a, "sandbox-1"); err != nil || !replaced.Veth || prev != "sandbox-1" {
			t.Fatalf("retried ADD, same session: prev %q replaced %+v err %v", prev, replaced, err)
		}
		s2, err := Open(pod)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if prev, replaced, err := addThrough(t, s2, node, a, "sandbox-1"); err != nil || !replaced.Veth || prev != "sandbox-1" {
			t.Fatalf("retried ADD, new session: prev %q replaced %+v err %v", prev, replaced, err)
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("Check: %v", err)
		}
		if rs, _ := routing.FindPodRules(a.PodIP); len(rs) != 2 {
			t.Errorf("%d rules, want 2: %v", len(rs), rs)
		}
		if err := Teardown(pod.Path(), "sandbox-1", a); err != nil {
			t.Fatal(err)
		}
		assertHostClean(t, a)
	})
}

// TestSessionNewSandboxReplacesOld: a new sandbox of the same pod (same
// host veth name, new netns, new address) replaces the old veth; the old
// alias is reported, and the old address keeps neither a host route nor a
// pod rule (B13: the caller gives it back to the daemon next). Rules that
// are not the old address's pod rules stay: another pod's, and a rule of
// the old address at the ENI priority.
func TestSessionNewSandboxReplacesOld(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		old := attachment(3)
		other := Attachment{PodIP: netip.MustParseAddr("100.64.7.11"), RouteTable: 3, MTU: 1500,
			HostVeth: HostVethName("eni", "default", "other", ""), IfName: "eth0"}
		_, otherNS := newNetnsNamed(t, "vct-dp-replace-other")
		if _, err := setup(node, otherNS, other); err != nil {
			t.Fatal(err)
		}
		eni := netlink.NewRule()
		eni.Priority, eni.Src, eni.Table = routing.PriorityENI, host32(old.PodIP), 3
		if err := netlink.RuleAdd(eni); err != nil {
			t.Fatal(err)
		}
		s, err := Open(pod)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := addThrough(t, s, node, old, "sandbox-old"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		_, pod2 := newNetns(t)
		nu := old
		nu.PodIP = netip.MustParseAddr("100.64.7.10")
		nu.RouteTable = 4
		s2, err := Open(pod2)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		prev, replaced, err := addThrough(t, s2, node, nu, "sandbox-new")
		if err != nil || prev != "sandbox-old" {
			t.Fatalf("new sandbox: prev %q replaced %+v err %v", prev, replaced, err)
		}
		if !replaced.Veth || !slices.Equal(replaced.Routed, []netip.Addr{old.PodIP}) || replaced.Rules != 2 {
			t.Errorf("replaced %+v, want the veth, routed [%v], 2 rules", replaced, old.PodIP)
		}
		if l, _ := HostRouteLink(old.PodIP); l != "" {
			t.Errorf("old address still routed via %s", l)
		}
		if rs, _ := routing.FindPodRules(old.PodIP); len(rs) != 0 {
			t.Errorf("old address keeps its pod rules: %v", rs)
		}
		if rs, _ := netlinksafe.RuleListFiltered(netlink.FAMILY_V4, eni, netlink.RT_FILTER_PRIORITY|netlink.RT_FILTER_SRC); len(rs) != 1 {
			t.Errorf("the ENI-priority rule of %v: %v, want it kept", old.PodIP, rs)
		}
		if _, err := Check(pod2, nu); err != nil {
			t.Errorf("Check new sandbox: %v", err)
		}
		if _, err := Check(otherNS, other); err != nil {
			t.Errorf("Check of another pod: %v", err)
		}
		for _, a := range []Attachment{nu, other} {
			if err := Teardown("", "", a); err != nil {
				t.Fatal(err)
			}
			assertHostClean(t, a)
		}
	})
}

// TestSessionPodNetnsDeletedBeforeConfigure: the runtime removes the pod
// netns (its bind mount and file) after Open and CreatePair. Configure
// either succeeds (the session's socket and the plugin's fd keep the netns
// alive) or fails; either way Teardown with the now missing path leaves no
// host veth, host route or rule behind.
func TestSessionPodNetnsDeletedBeforeConfigure(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(3)
		s := openPaired(t, node, pod, a)
		if err := netnsdir.Delete(podName); err != nil {
			t.Fatal(err)
		}
		_, cerr := s.Configure(a)
		t.Logf("Configure after the netns was deleted: %v", cerr)
		if err := Teardown(pod.Path(), "", a); err != nil {
			t.Errorf("Teardown with the netns path gone: %v", err)
		}
		assertHostClean(t, a)
	})
}

// TestSessionPodInterfaceGoneBeforeConfigure: the pod end of the pair
// disappears between CreatePair and Configure (the netns being torn down);
// Configure fails and names it, and Teardown leaves nothing behind.
func TestSessionPodInterfaceGoneBeforeConfigure(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(3)
		s := openPaired(t, node, pod, a)
		if _, err := DeletePodInterface(pod.Path(), a.IfName, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Configure(a); err == nil {
			t.Fatal("Configure succeeded without a pod interface")
		}
		if err := Teardown(pod.Path(), "", a); err != nil {
			t.Errorf("Teardown: %v", err)
		}
		assertHostClean(t, a)
	})
}

// TestSessionStaleRulesReplaced: stale pod rules of the address at both
// priorities, pointing at other tables, are replaced through the session.
func TestSessionStaleRulesReplaced(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(3)
		from := netlink.NewRule()
		from.Priority, from.Src, from.Table = routing.PriorityFromPod, host32(a.PodIP), 7
		to := netlink.NewRule()
		to.Priority, to.Dst, to.Table = routing.PriorityToPod, host32(a.PodIP), 9
		for _, r := range []*netlink.Rule{from, to} {
			if err := netlink.RuleAdd(r); err != nil {
				t.Fatal(err)
			}
		}
		s, err := Open(pod)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, _, err := addThrough(t, s, node, a, "x"); err != nil {
			t.Fatal(err)
		}
		rs, _ := routing.FindPodRules(a.PodIP)
		if len(rs) != 2 {
			t.Errorf("rules %v, want exactly the pod's 2", rs)
		}
		for _, r := range rs {
			if r.Table == 7 || r.Table == 9 {
				t.Errorf("stale rule kept: %s", routing.Describe(r))
			}
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("Check: %v", err)
		}
	})
}

// TestSessionConcurrentADDsWithRuleChurn: 30 ADDs at once, each through
// its own session in the same node netns, while other rules are added and
// removed without pause (dumps interrupted): every ADD succeeds and ends
// with exactly its rules.
func TestSessionConcurrentADDsWithRuleChurn(t *testing.T) {
	const n = 30
	_, node := newNetns(t)
	pods := make([]ns.NetNS, n)
	for i := range pods {
		_, pods[i] = newNetnsNamed(t, fmt.Sprintf("vct-dp-cc-%02d", i))
	}
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() {
		defer churn.Done()
		runtime.LockOSThread()
		_ = node.Set()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := netlink.NewRule()
			r.Priority, r.Src, r.Table = 2000+i%50, host32(netip.AddrFrom4([4]byte{10, 9, byte(i % 50), 1})), 100
			_ = netlink.RuleAdd(r)
			_ = netlink.RuleDel(r)
		}
	}()
	// Background rules make each dump long enough to be interrupted.
	_ = node.Do(func(ns.NetNS) error {
		for i := range 300 {
			r := netlink.NewRule()
			r.Priority, r.Src, r.Table = 3000, host32(netip.AddrFrom4([4]byte{10, 8, byte(i / 250), byte(i % 250)})), 101
			if err := netlink.RuleAdd(r); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = node.Do(func(ns.NetNS) error {
				a := Attachment{PodIP: netip.AddrFrom4([4]byte{100, 64, 9, byte(10 + i)}), RouteTable: 2 + i%3, MTU: 1500,
					HostVeth: HostVethName("eni", "default", fmt.Sprintf("cc%02d", i), ""), IfName: "eth0"}
				s, err := Open(pods[i])
				if err != nil {
					return err
				}
				defer s.Close()
				if _, err := s.CreatePair(node, a.HostVeth, a.IfName, a.MTU, ""); err != nil {
					return err
				}
				_, err = s.Configure(a)
				return err
			})
		}()
	}
	wg.Wait()
	close(stop)
	churn.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
	// Counted once every ADD is done: a rule dump taken while another
	// ADD inserts a rule of lower priority can list an entry twice (the
	// kernel resumes a multi-part dump by position), which says nothing of
	// the rules themselves.
	_ = node.Do(func(ns.NetNS) error {
		for i := range n {
			addr := netip.AddrFrom4([4]byte{100, 64, 9, byte(10 + i)})
			rs, err := routing.FindPodRules(addr)
			if err != nil {
				t.Error(err)
			} else if len(rs) != 2 {
				t.Errorf("%v: %d rules, want 2", addr, len(rs))
			}
		}
		return nil
	})
}

// newNetnsNamed is newNetns with a given name.
func newNetnsNamed(t *testing.T, name string) (string, ns.NetNS) {
	t.Helper()
	_ = netnsdir.Delete(name)
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	h, err := ns.GetNS(netnsdir.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		_ = netnsdir.Delete(name)
	})
	return name, h
}

// openPaired opens a Session into pod and creates a's veth pair through it;
// the Session is closed when the test ends.
func openPaired(t *testing.T, node, pod ns.NetNS, a Attachment) *Session {
	t.Helper()
	s, err := Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.CreatePair(node, a.HostVeth, a.IfName, a.MTU, ""); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPodInterfaceOfAnotherOwner: an interface of the requested name in
// the pod netns that is not the sandbox's — another attachment's veth, or
// a veth pair made inside the pod netns by someone else — is neither
// replaced by ADD's CreatePair nor deleted by DEL's DeletePodInterface:
// ADD fails wrapping ErrNotOwned and DEL leaves it, returning none of its
// addresses. The owner's own DEL deletes it.
func TestPodInterfaceOfAnotherOwner(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(3)
		if _, _, err := addThrough(t, openSession(t, pod), node, a, "vpcip/net/c1/eth0"); err != nil {
			t.Fatal(err)
		}
		// A second sandbox's ADD into the same netns under the same name.
		b := a
		b.HostVeth = HostVethName("eni", "default", "other", "")
		b.PodIP = netip.MustParseAddr("100.64.7.10")
		if _, err := openSession(t, pod).CreatePair(node, b.HostVeth, b.IfName, b.MTU, "vpcip/net/c2/eth0"); !errors.Is(err, ErrNotOwned) {
			t.Fatalf("CreatePair over c1's eth0: %v; want ErrNotOwned", err)
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("c1 after c2's ADD: %v", err)
		}
		// A DEL of c2 (never wired) with c1's netns.
		addrs, err := DeletePodInterface(pod.Path(), "eth0", "vpcip/net/c2/eth0")
		if !errors.Is(err, ErrNotOwned) || len(addrs) != 0 {
			t.Fatalf("DeletePodInterface as c2: %v, %v; want ErrNotOwned and no addresses", addrs, err)
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("c1 after c2's DEL: %v", err)
		}
		if err := Teardown(pod.Path(), "vpcip/net/c2/eth0", b); err != nil {
			t.Errorf("Teardown as c2: %v", err)
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("c1 after c2's Teardown: %v", err)
		}
		// The owner's DEL.
		addrs, err = DeletePodInterface(pod.Path(), "eth0", "vpcip/net/c1/eth0")
		if err != nil || len(addrs) != 1 || addrs[0] != a.PodIP {
			t.Fatalf("DeletePodInterface as c1: %v, %v; want [%v]", addrs, err, a.PodIP)
		}
		if err := Teardown(pod.Path(), "vpcip/net/c1/eth0", a); err != nil {
			t.Fatal(err)
		}
		assertHostClean(t, a)

		// A veth pair made inside the pod netns (no node end).
		h, err := handleAt(pod)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		foreign := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth9"}, PeerName: "peer9"}
		if err := h.LinkAdd(foreign); err != nil {
			t.Fatal(err)
		}
		if _, err := openSession(t, pod).CreatePair(node, a.HostVeth, "eth9", a.MTU, "vpcip/net/c3/eth9"); !errors.Is(err, ErrNotOwned) {
			t.Fatalf("CreatePair over a foreign eth9: %v; want ErrNotOwned", err)
		}
		if _, err := DeletePodInterface(pod.Path(), "eth9", "vpcip/net/c3/eth9"); !errors.Is(err, ErrNotOwned) {
			t.Fatalf("DeletePodInterface of a foreign eth9: %v; want ErrNotOwned", err)
		}
		for _, name := range []string{"eth9", "peer9"} {
			if _, err := h.LinkByName(name); err != nil {
				t.Errorf("foreign %s: %v", name, err)
			}
		}
	})
}

// openSession opens a Session into pod, closed at the test's end.
func openSession(t *testing.T, pod ns.NetNS) *Session {
	t.Helper()
	s, err := Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
