package datapath

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/routing"
	"github.com/vpcip/vpcip/test/netnsdir"
)

// newNetns makes a throwaway "vct-dp-*" netns removed at cleanup.
func newNetns(t *testing.T) (string, ns.NetNS) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	name := "vct-dp-" + strings.ReplaceAll(t.Name(), "/", "-")
	if len(name) > 40 {
		name = name[:40]
	}
	_ = netnsdir.Delete(name)
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	h, err := ns.GetNS(filepath.Join("/var/run/netns", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		_ = netnsdir.Delete(name)
	})
	return name, h
}

// world is a node netns and a pod netns; fn runs in the node netns.
func world(t *testing.T, fn func(node, pod ns.NetNS, podName string)) {
	_, node := newNetns(t)
	podName, pod := newNetns(t)
	err := node.Do(func(ns.NetNS) error {
		fn(node, pod, podName)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func attachment(table int) Attachment {
	return Attachment{PodIP: netip.MustParseAddr("100.64.7.9"), RouteTable: table, MTU: 1500,
		HostVeth: HostVethName("eni", "default", "dp", ""), IfName: "eth0"}
}

func TestSetupCheckTeardown(t *testing.T) {
	for _, table := range []int{0, 3} {
		t.Run(map[int]string{0: "primary ENI", 3: "secondary ENI table 3"}[table], func(t *testing.T) {
			world(t, func(node, pod ns.NetNS, podName string) {
				a := attachment(table)
				w, err := setup(node, pod, a)
				if err != nil {
					t.Fatalf("Setup: %v", err)
				}
				if w.Host.Name != a.HostVeth || w.Pod.Name != "eth0" || w.Host.MTU != 1500 || w.Pod.MTU != 1500 {
					t.Errorf("wired %+v", w)
				}
				if _, err := Check(pod, a); err != nil {
					t.Errorf("Check after Setup: %v", err)
				}
				wantRules := 1
				if table != 0 {
					wantRules = 2
				}
				if rs, _ := routing.FindPodRules(a.PodIP); len(rs) != wantRules {
					t.Errorf("%d rules for %v, want %d", len(rs), a.PodIP, wantRules)
				}
				// A retried Setup for the same attachment converges.
				if _, err := setup(node, pod, a); err != nil {
					t.Fatalf("second Setup: %v", err)
				}
				if _, err := Check(pod, a); err != nil {
					t.Errorf("Check after second Setup: %v", err)
				}
				if err := Teardown(pod.Path(), "", a); err != nil {
					t.Fatalf("Teardown: %v", err)
				}
				if rs, _ := routing.FindPodRules(a.PodIP); len(rs) != 0 {
					t.Errorf("rules left: %v", rs)
				}
				if l, _ := HostRouteLink(a.PodIP); l != "" {
					t.Errorf("host route left via %s", l)
				}
				if _, err := netlinksafe.LinkByName(a.HostVeth); err == nil {
					t.Errorf("host veth left")
				}
				if err := Teardown(pod.Path(), "", a); err != nil {
					t.Errorf("second Teardown: %v", err)
				}
			})
		})
	}
}

// TestCheckNamesFaults: each broken piece is named.
func TestCheckNamesFaults(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(2)
		if _, err := setup(node, pod, a); err != nil {
			t.Fatal(err)
		}
		// Checked as a primary-ENI address, the 1536 rule is one too many.
		b := a
		b.RouteTable = 0
		if _, err := Check(pod, b); err == nil || !strings.Contains(err.Error(), `unexpected rule "1536: from 100.64.7.9/32 lookup 2"`) {
			t.Errorf("Check with the wrong table: %v", err)
		}
		rs, _ := routing.FindPodRules(a.PodIP)
		for _, r := range rs {
			if r.Priority == routing.PriorityFromPod {
				if err := netlink.RuleDel(&r); err != nil {
					t.Fatal(err)
				}
			}
		}
		_ = pod.Do(func(ns.NetNS) error {
			l, _ := netlinksafe.LinkByName("eth0")
			return netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: host32(Gateway).IP})
		})
		_, err := Check(pod, a)
		for _, want := range []string{`rule "1536: from 100.64.7.9/32 lookup 2" missing`, "pod permanent neighbour 169.254.1.1 on eth0 missing"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Check: %v; want it to say %q", err, want)
			}
		}
	})
}

// TestSetupReplacesStaleRule (B28): a 1536 rule for the address pointing at
// another table (left by an earlier owner) is replaced, not kept beside ours.
func TestSetupReplacesStaleRule(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(3)
		stale := netlink.NewRule()
		stale.Priority, stale.Src, stale.Table = routing.PriorityFromPod, host32(a.PodIP), 7
		if err := netlink.RuleAdd(stale); err != nil {
			t.Fatal(err)
		}
		if _, err := setup(node, pod, a); err != nil {
			t.Fatal(err)
		}
		rs, _ := routing.FindPodRules(a.PodIP)
		for _, r := range rs {
			if r.Table == 7 {
				t.Errorf("stale rule to table 7 kept: %v", rs)
			}
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("Check: %v", err)
		}
	})
}

// TestRemoveOnlyTouchesTheAddress (B14): removing one pod's host state
// leaves another's alone.
func TestRemoveOnlyTouchesTheAddress(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(2)
		if _, err := setup(node, pod, a); err != nil {
			t.Fatal(err)
		}
		other := netip.MustParseAddr("100.64.7.10")
		if n, err := routing.RemovePodRules(other); n != 0 || err != nil {
			t.Errorf("routing.RemovePodRules(other) = %d, %v", n, err)
		}
		if err := RemoveHostRoute(a.PodIP, "eniother"); err != nil {
			t.Fatal(err)
		}
		if n, err := routing.RemovePodRules(netip.Addr{}); n != 0 || err != nil {
			t.Errorf("RemoveRules(zero) = %d, %v", n, err)
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("pod damaged by removals for other addresses: %v", err)
		}
	})
}

func TestDeletePodInterfaceNetnsGone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	_, err := DeletePodInterface("/var/run/netns/vct-dp-does-not-exist", "eth0", "")
	if !errors.Is(err, ErrNetnsGone) {
		t.Errorf("missing netns: %v, want ErrNetnsGone", err)
	}
	f := filepath.Join(t.TempDir(), "file")
	_ = os.WriteFile(f, nil, 0o644)
	if _, err := DeletePodInterface(f, "eth0", ""); !errors.Is(err, ErrNetnsGone) {
		t.Errorf("regular file: %v, want ErrNetnsGone", err)
	}
}

func TestDeleteHostVethRefusesOtherLinks(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "eniabc"}}
		if err := netlink.LinkAdd(br); err != nil {
			t.Fatal(err)
		}
		if _, err := DeleteHostVeth("eniabc"); err == nil || !strings.Contains(err.Error(), "not a veth") {
			t.Errorf("DeleteHostVeth(bridge) = %v, want a refusal", err)
		}
		if _, err := netlinksafe.LinkByName("eniabc"); err != nil {
			t.Errorf("bridge was deleted")
		}
		if existed, err := DeleteHostVeth("enimissing"); existed || err != nil {
			t.Errorf("DeleteHostVeth(missing) = %v, %v", existed, err)
		}
	})
}

// setup wires one pod as ADD does: CreatePair, then Configure. It must be called with
// hostNS as the current netns. On error the caller undoes with Teardown.
func setup(hostNS, podNS ns.NetNS, a Attachment) (Wired, error) {
	if err := a.validate(); err != nil {
		return Wired{}, err
	}
	replaced, err := CreatePair(hostNS, podNS, a.HostVeth, a.IfName, a.MTU, "")
	if err != nil {
		return Wired{}, err
	}
	w, err := Configure(podNS, a)
	w.ReplacedHostVeth = replaced.Veth
	return w, err
}

// TestPairHasOneQueueEachWay: both ends of the pair are created with one
// TX and one RX queue. An end created with a queue per possible CPU is cut
// to one by the kernel under the rtnl lock with an expedited RCU grace
// period, which serializes a burst of ADDs (BenchmarkSetupTeardown's
// pair-ms).
func TestPairHasOneQueueEachWay(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		a := attachment(2)
		if _, err := setup(node, pod, a); err != nil {
			t.Fatalf("Setup: %v", err)
		}
		host, err := netlinksafe.LinkByName(a.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		var podLink netlink.Link
		if err := pod.Do(func(ns.NetNS) error {
			podLink, err = netlinksafe.LinkByName(a.IfName)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for _, l := range []netlink.Link{host, podLink} {
			if at := l.Attrs(); at.NumTxQueues != 1 || at.NumRxQueues != 1 {
				t.Errorf("%s has %d TX and %d RX queues, want 1 and 1", at.Name, at.NumTxQueues, at.NumRxQueues)
			}
		}
		if err := Teardown(pod.Path(), "", a); err != nil {
			t.Fatal(err)
		}
	})
}

// TestHostRouteLinkGoneLink: a route listed just before its link went away
// (the pod's veth deleted by its runtime while a DEL or GC looks) reads as
// no route, not as an error that keeps the address for the next GC; the
// link of a live route reads by name.
func TestHostRouteLinkGoneLink(t *testing.T) {
	_, node := newNetns(t)
	err := node.Do(func(ns.NetNS) error {
		if name, err := linkNameOf(1 << 30); name != "" || err != nil {
			t.Errorf("link index with no link: %q, %v; want \"\", nil", name, err)
		}
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		if name, err := linkNameOf(lo.Attrs().Index); name != "lo" || err != nil {
			t.Errorf("loopback's index: %q, %v; want lo", name, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
