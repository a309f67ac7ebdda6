package cnitest

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// synSent is TCP_CONNTRACK_SYN_SENT: a client's SYN seen, no answer yet.
const synSent = 1

// trackFlow adds a TCP conntrack entry in the node netns: orig src → dst,
// reply from replySrc (the DNAT target) back to src.
func trackFlow(t *testing.T, e *Env, src, dst, replySrc netip.Addr, sport uint16) {
	t.Helper()
	flow := &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    netlink.IPTuple{SrcIP: ip(src), DstIP: ip(dst), Protocol: unix.IPPROTO_TCP, SrcPort: sport, DstPort: 80},
		Reverse:    netlink.IPTuple{SrcIP: ip(replySrc), DstIP: ip(src), Protocol: unix.IPPROTO_TCP, SrcPort: 80, DstPort: sport},
		TimeOut:    120,
		ProtoInfo:  &netlink.ProtoInfoTCP{State: synSent},
	}
	if err := e.Node.Do(func() error { return netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, flow) }); err != nil {
		t.Fatalf("create conntrack entry %v → %v (reply from %v): %v", src, dst, replySrc, err)
	}
}

// flowsOf counts the node's conntrack entries naming a in either direction.
func flowsOf(t *testing.T, e *Env, a netip.Addr) int {
	t.Helper()
	var flows []*netlink.ConntrackFlow
	err := e.Node.Do(func() (err error) {
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		return err
	})
	if err != nil {
		t.Fatalf("list conntrack: %v", err)
	}
	n := 0
	for _, f := range flows {
		for _, x := range []net.IP{f.Forward.SrcIP, f.Forward.DstIP, f.Reverse.SrcIP, f.Reverse.DstIP} {
			if x.Equal(ip(a)) {
				n++
				break
			}
		}
	}
	return n
}

func ip(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

// vpcipd flushes the conntrack entries of a deleted pod's address before
// it hands the address to another pod, including entries made for it while
// it cooled down, so a client's retransmitted SYN to a Service whose backend
// was deleted (SYN_SENT lives 120 s) never reaches the pod that gets the
// address next (issue kind 4). Another address's entries stay. With
// IP_COOLDOWN_PERIOD=0 the ADD that reuses the address waits for the flush;
// with a cooldown the daemon flushes it as the cooldown ends.
func TestConntrackOfDeletedPodIsFlushed(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	d := v.daemons[0]
	e := NewEnv(t, v.nodes[0], d)
	e.Chain = false
	client, service := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("10.96.0.10")
	bystander := netip.MustParseAddr("100.64.200.200")
	trackFlow(t, e, client, service, bystander, 40003) // another backend

	t.Run("no cooldown", func(t *testing.T) {
		d.Stop(t)
		d.env = append(d.env, "IP_COOLDOWN_PERIOD=0")
		d.Start(t)
		old := e.NewPod(t, "backend")
		e.MustAdd(t, old)
		trackFlow(t, e, client, service, old.Address, 40001) // Service DNAT to the pod
		trackFlow(t, e, old.Address, client, client, 40002)  // the pod's own connection
		if n := flowsOf(t, e, old.Address); n != 2 {
			t.Fatalf("setup: %d entries name %v, want 2", n, old.Address)
		}
		mustDel(t, e, old)
		// After the DEL, the Service's stale rule sent a SYN again.
		trackFlow(t, e, client, service, old.Address, 40004)
		// Pods come until one is given the old address (the pool may hold
		// others the datastore picks first); each ADD runs with no cooldown.
		var next *Pod
		var others []*Pod
		for i := 0; next == nil; i++ {
			if i == 20 {
				t.Fatalf("setup: %d pods started, none was given the freed %v; log:\n%s", i, old.Address, d.log())
			}
			p := e.NewPod(t, "next"+strconv.Itoa(i))
			e.MustAdd(t, p)
			if p.Address == old.Address {
				next = p
			} else {
				others = append(others, p)
			}
		}
		if n := flowsOf(t, e, next.Address); n != 0 {
			t.Errorf("the next pod was given %v while %d old conntrack entries still lead to it", next.Address, n)
		}
		for _, p := range append(others, next) {
			mustDel(t, e, p)
		}
	})
	t.Run("cooldown", func(t *testing.T) {
		d.Stop(t)
		d.env = append(d.env, "IP_COOLDOWN_PERIOD=2")
		d.Start(t)
		old := e.NewPod(t, "backend2")
		e.MustAdd(t, old)
		trackFlow(t, e, client, service, old.Address, 40011)
		mustDel(t, e, old)
		// While the address cools down, a client retransmits to it.
		trackFlow(t, e, client, service, old.Address, 40012)
		deadline := time.Now().Add(15 * time.Second)
		for flowsOf(t, e, old.Address) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d conntrack entries still lead to %v 15 s after its 2 s cooldown began; log:\n%s",
					flowsOf(t, e, old.Address), old.Address, d.log())
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	if n := flowsOf(t, e, bystander); n != 1 {
		t.Errorf("%d entries name %v, want its 1 untouched", n, bystander)
	}
}
