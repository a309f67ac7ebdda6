package cnitest

import (
	"net"
	"net/netip"
	"testing"

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

// A deleted pod's conntrack entries go with it, and entries made for its
// address while it cooled down are gone before the next pod is wired with
// it, so a client's retransmitted SYN to a Service whose backend was deleted
// (SYN_SENT lives 120 s) never reaches the pod that gets the address next
// (issue kind 4). Another address's entries stay.
func TestConntrackOfDeletedPodIsFlushed(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool(1))
	client, service := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("10.96.0.10")
	bystander := netip.MustParseAddr("100.64.200.200")
	old := e.NewPod(t, "backend")
	e.MustAdd(t, old)
	trackFlow(t, e, client, service, old.Address, 40001) // Service DNAT to the pod
	trackFlow(t, e, old.Address, client, client, 40002)  // the pod's own connection
	trackFlow(t, e, client, service, bystander, 40003)   // another backend
	if n := flowsOf(t, e, old.Address); n != 2 {
		t.Fatalf("setup: %d entries name %v, want 2", n, old.Address)
	}
	mustDel(t, e, old)
	if n := flowsOf(t, e, old.Address); n != 0 {
		t.Errorf("after DEL, %d conntrack entries still name the deleted pod's %v", n, old.Address)
	}
	if n := flowsOf(t, e, bystander); n != 1 {
		t.Errorf("after DEL, %d entries name %v, want its 1 untouched", n, bystander)
	}
	// While the address cooled down, the Service's stale rule sent a SYN again.
	trackFlow(t, e, client, service, old.Address, 40004)
	next := e.NewPod(t, "next")
	e.MustAdd(t, next)
	if next.Address != old.Address {
		t.Fatalf("setup: next pod got %v, want the reused %v", next.Address, old.Address)
	}
	if n := flowsOf(t, e, next.Address); n != 0 {
		t.Errorf("the next pod was wired with %v while %d old conntrack entries still lead to it", next.Address, n)
	}
	mustDel(t, e, next)
}
