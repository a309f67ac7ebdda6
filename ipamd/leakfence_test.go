package ipamd

import (
	"context"
	"net/netip"
	"testing"
)

// leakRaceHost is memHost whose RemovePodRules first lets a late DEL of the
// leaked key release the address and a new ADD ask for one, as the socket
// server may serve them while the release of a pod gone from the API server
// removes the rules.
type leakRaceHost struct {
	*memHost
	n    *node
	dead string
	got  []netip.Addr
}

func (h *leakRaceHost) RemovePodRules(a netip.Addr) (int, error) {
	h.n.del(h.dead)
	if b, err := h.n.add("racing"); err == nil {
		h.got = append(h.got, b.Address)
	}
	return h.memHost.RemovePodRules(a)
}

// TestLeakReleaseFencedAgainstLateDEL: the release of an address whose pod
// the Kubernetes part found gone removes its pod rules while it is held,
// then releases it. With IP_COOLDOWN_PERIOD=0 a late DEL of the key may
// release the address in between; an ADD served then must not be given it
// (its new rules would be the ones removed, B13).
func TestLeakReleaseFencedAgainstLateDEL(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"IP_COOLDOWN_PERIOD": "0"})
	host := &leakRaceHost{memHost: newMemHost(), n: n, dead: "leaked"}
	pods := newFakePods()
	n.host, n.pods = host, pods
	n.start()
	a := n.mustAdd("leaked")
	pods.setGone(key("leaked"))
	n.cycle(func(context.Context) { n.d.work.gone.run() })
	if len(host.got) != 1 {
		t.Fatalf("setup: the racing ADD got %v", host.got)
	}
	if host.got[0] == a.Address {
		t.Errorf("an ADD was given %v while the leak release removed its rules (late DEL, no cooldown)", a.Address)
	}
	n.del("racing")
	if b := n.mustAdd("after"); b.Address != a.Address {
		t.Errorf("after the leak release: ADD got %v, want %v (no longer fenced)", b.Address, a.Address)
	}
}
