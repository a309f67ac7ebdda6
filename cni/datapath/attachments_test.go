package datapath

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// outLink is the link the pod netns would send a packet to dst from src by
// (src invalid: no source given, as a socket not bound to an address).
func outLink(t *testing.T, pod ns.NetNS, dst, src netip.Addr) string {
	t.Helper()
	var name string
	err := pod.Do(func(ns.NetNS) error {
		opts := &netlink.RouteGetOptions{}
		if src.IsValid() {
			opts.SrcAddr = net.IP(src.AsSlice())
		}
		rs, err := netlink.RouteGetWithOptions(net.IP(dst.AsSlice()), opts)
		if err != nil {
			return err
		}
		l, err := netlink.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			return err
		}
		name = l.Attrs().Name
		return nil
	})
	if err != nil {
		t.Fatalf("route get %v from %v in the pod: %v", dst, src, err)
	}
	return name
}

// TestSecondAttachmentKeepsTheDefaultRoute: a pod's second attachment
// (Multus "net1") is routed by source inside the pod (docs/design.md §4):
// the pod's default route stays on eth0, whichever attachment was wired
// last, and packets from net1's address leave by net1. CHECK verifies each
// attachment's own shape; net1's DEL removes its rule and leaves eth0
// wired.
func TestSecondAttachmentKeepsTheDefaultRoute(t *testing.T) {
	world(t, func(node, pod ns.NetNS, podName string) {
		eth0 := attachment(0)
		net1 := Attachment{PodIP: netip.MustParseAddr("100.64.7.10"), RouteTable: 3, MTU: 1500,
			HostVeth: AttachmentVethName("eni", "default", "dp", "", "net-b", "net1"), IfName: "net1"}
		if _, err := setup(node, pod, eth0); err != nil {
			t.Fatalf("Setup eth0: %v", err)
		}
		if _, err := setup(node, pod, net1); err != nil {
			t.Fatalf("Setup net1: %v", err)
		}
		outside := netip.MustParseAddr("198.51.100.7")
		if got := outLink(t, pod, outside, netip.Addr{}); got != "eth0" {
			t.Errorf("pod's default route after net1's ADD leaves by %s, want eth0", got)
		}
		if got := outLink(t, pod, outside, eth0.PodIP); got != "eth0" {
			t.Errorf("from eth0's %v: leaves by %s, want eth0", eth0.PodIP, got)
		}
		if got := outLink(t, pod, outside, net1.PodIP); got != "net1" {
			t.Errorf("from net1's %v: leaves by %s, want net1", net1.PodIP, got)
		}
		for _, a := range []Attachment{eth0, net1} {
			if _, err := Check(pod, a); err != nil {
				t.Errorf("Check %s: %v", a.IfName, err)
			}
		}
		// CHECK names net1's missing source rule.
		if err := pod.Do(func(ns.NetNS) error {
			rs := podSourceRulesHere()
			for i := range rs {
				if err := netlink.RuleDel(&rs[i]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := Check(pod, net1); err == nil || !strings.Contains(err.Error(), "pod rule 1536: from 100.64.7.10/32 lookup") {
			t.Errorf("Check net1 without its pod rule: %v; want the rule named", err)
		}
		// A retried ADD of net1 converges and still leaves eth0 the default.
		if _, err := setup(node, pod, net1); err != nil {
			t.Fatalf("second Setup net1: %v", err)
		}
		if _, err := Check(pod, net1); err != nil {
			t.Errorf("Check net1 after its second ADD: %v", err)
		}
		if got := outLink(t, pod, outside, netip.Addr{}); got != "eth0" {
			t.Errorf("after net1's second ADD the default leaves by %s, want eth0", got)
		}
		if err := Teardown(pod.Path(), "", net1); err != nil {
			t.Fatalf("Teardown net1: %v", err)
		}
		if rules := podSourceRules(t, pod); len(rules) != 0 {
			t.Errorf("pod rules left after net1's DEL: %v", rules)
		}
		if _, err := Check(pod, eth0); err != nil {
			t.Errorf("Check eth0 after net1's DEL: %v", err)
		}
		if got := outLink(t, pod, outside, netip.Addr{}); got != "eth0" {
			t.Errorf("after net1's DEL the default leaves by %s, want eth0", got)
		}
	})
}

// podSourceRules lists the pod netns's IPv4 rules that have a source.
func podSourceRules(t *testing.T, pod ns.NetNS) []netlink.Rule {
	t.Helper()
	var out []netlink.Rule
	if err := pod.Do(func(ns.NetNS) error { out = podSourceRulesHere(); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// podSourceRulesHere lists the current netns's IPv4 rules that have a source.
func podSourceRulesHere() []netlink.Rule {
	rs, _ := netlinksafe.RuleList(netlink.FAMILY_V4)
	var out []netlink.Rule
	for _, r := range rs {
		if r.Src != nil {
			out = append(out, r)
		}
	}
	return out
}
