package cluster_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/ipamd/introspect"
)

// heldSource holds one assignment until it is released.
type heldSource struct {
	asg  introspect.Assignment
	held bool
}

func (s *heldSource) State() introspect.State {
	if !s.held {
		return introspect.State{}
	}
	return introspect.State{Assignments: []introspect.Assignment{s.asg}}
}

func (s *heldSource) Release(req api.ReleaseRequest) (api.ReleaseResponse, error) {
	if !s.held || req.Key != s.asg.Key {
		return api.ReleaseResponse{Version: api.Version}, nil
	}
	s.held = false
	return api.ReleaseResponse{Version: api.Version, Released: true}, nil
}

func (s *heldSource) PodsHolding() map[string]bool { return nil }

func (s *heldSource) FenceHeld(k api.Key, addr netip.Addr) (func(), bool) {
	return func() {}, s.held && k == s.asg.Key && addr == s.asg.Address
}

// rulesHost has no pod routes; RemovePodRules records whether the source
// still held the address, and fails while fail is set.
type rulesHost struct {
	src          *heldSource
	heldAtRemove []bool
	fail         bool
}

func (h *rulesHost) PodRoutes() ([]hostnet.PodRoute, error) { return nil, nil }

func (h *rulesHost) RemovePodRules(netip.Addr) (int, error) {
	h.heldAtRemove = append(h.heldAtRemove, h.src.held)
	if h.fail {
		return 0, errors.New("netlink: operation not permitted")
	}
	return 2, nil
}

// TestReleaseLeakedRemovesRulesFirst: a leaked address's pod rules go while
// it is still held (no ADD can have been given it, B13), and one whose
// rules could not be removed is not released.
func TestReleaseLeakedRemovesRulesFirst(t *testing.T) {
	k := api.Key{Network: "vpcip", ContainerID: "gone", IfName: "eth0"}
	src := &heldSource{asg: introspect.Assignment{Key: k, Address: netip.MustParseAddr("10.0.0.11")}, held: true}
	host := &rulesHost{src: src, fail: true}
	a := &cluster.Adapter{Source: src, Host: host}
	if released, why := a.ReleaseLeaked(cluster.Assignment{Key: k}); released || !src.held {
		t.Fatalf("rules not removable: released %v (%q), want kept held", released, why)
	}
	host.fail = false
	if released, why := a.ReleaseLeaked(cluster.Assignment{Key: k}); !released || src.held {
		t.Fatalf("released %v (%q), want released", released, why)
	}
	for i, held := range host.heldAtRemove {
		if !held {
			t.Errorf("rule removal %d ran after the release", i)
		}
	}
}
