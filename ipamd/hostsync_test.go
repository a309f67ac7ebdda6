package ipamd

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/provider"
)

var testENI = provider.ENI{
	ID: "eni-0123456789abcdef0", MAC: "0a:00:00:00:00:02", DeviceNumber: 1, SubnetID: "subnet-1",
	SubnetCIDR: netip.MustParsePrefix("10.0.0.0/24"), Gateway: netip.MustParseAddr("10.0.0.1"),
	PrimaryIP: netip.MustParseAddr("10.0.0.10"), Attached: time.Now().Add(-time.Hour).UTC().Truncate(time.Second),
	SecondaryIPs: []netip.Addr{netip.MustParseAddr("10.0.0.11")},
	Prefixes:     []netip.Prefix{netip.MustParsePrefix("10.0.0.32/28")},
}

// TestENIConversions: the datastore's ENI converts back to the cloud's form
// with its slots split into addresses and prefixes, and the host gets the
// link, table and rule facts plus the MTU.
func TestENIConversions(t *testing.T) {
	s := datastore.New(0)
	s.Cloud().Sync([]provider.ENI{testENI}, time.Now())
	got := cloudENI(s.ENIs()[0])
	if got.ID != testENI.ID || got.MAC != testENI.MAC || got.DeviceNumber != 1 || got.SubnetCIDR != testENI.SubnetCIDR ||
		got.Gateway != testENI.Gateway || got.PrimaryIP != testENI.PrimaryIP || got.SubnetID != testENI.SubnetID || !got.Attached.Equal(testENI.Attached) ||
		!slices.Equal(got.SecondaryIPs, testENI.SecondaryIPs) || !slices.Equal(got.Prefixes, testENI.Prefixes) {
		t.Errorf("cloudENI(datastore ENI) = %+v, want %+v", got, testENI)
	}
	want := hostnet.ENI{MAC: testENI.MAC, DeviceNumber: 1, PrimaryIP: testENI.PrimaryIP,
		SubnetCIDR: testENI.SubnetCIDR, Gateway: testENI.Gateway, MTU: 9001}
	if h := hostENI(got, 9001); h != want {
		t.Errorf("hostENI = %+v, want %+v", h, want)
	}
}

// lockProbeHost is memHost whose RemovePodRules reads hostSync's and the
// datastore's state from another goroutine: if releaseRouteless held either
// lock across the host call, the read would not finish.
type lockProbeHost struct {
	*memHost
	hs      *hostSync
	blocked bool
}

func (h *lockProbeHost) RemovePodRules(a netip.Addr) (int, error) {
	done := make(chan struct{})
	go func() {
		h.hs.linkNames()
		h.hs.failures()
		h.hs.store.Counts(time.Now())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		h.blocked = true
	}
	return h.memHost.RemovePodRules(a)
}

// TestReleaseRoutelessHoldsNoLock: an assignment whose pod route is gone on
// two checks is released and its pod rules removed, with no lock held while
// the host is called.
func TestReleaseRoutelessHoldsNoLock(t *testing.T) {
	store := datastore.New(0)
	now := time.Now()
	store.Cloud().Sync([]provider.ENI{testENI}, now)
	k := api.Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}
	netnsDir := t.TempDir() // the pod's netns file is gone from it
	a, _, err := store.AssignIn(k, api.Pod{Namespace: "default", Name: "p"}, filepath.Join(netnsDir, "cni-c1"), now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	host := &lockProbeHost{memHost: newMemHost()}
	hs := newHostSync(host, config.Config{GCGrace: time.Minute}, store, slog.New(slog.DiscardHandler),
		NewMetrics(prometheus.NewRegistry()), time.Now, []string{netnsDir})
	host.hs = hs
	hs.checkPods(false)
	if _, held := store.Get(k); !held {
		t.Fatal("released after one check without a route; want two")
	}
	hs.checkPods(false)
	if _, held := store.Get(k); held {
		t.Fatal("still assigned after two checks without a route")
	}
	if !slices.Contains(host.rulesRemoved, a.Address) {
		t.Errorf("pod rules of %s not removed: %v", a.Address, host.rulesRemoved)
	}
	if host.blocked {
		t.Error("a lock was held while the host removed pod rules")
	}
}

// orderProbeHost is memHost whose RemovePodRules records whether the
// address was still held when its rules went, and fails while fail is set.
type orderProbeHost struct {
	*memHost
	store        *datastore.Store
	heldAtRemove []bool
	fail         bool
}

func (h *orderProbeHost) RemovePodRules(a netip.Addr) (int, error) {
	_, held := h.store.Holder(a)
	h.heldAtRemove = append(h.heldAtRemove, held)
	if h.fail {
		return 0, errors.New("netlink: operation not permitted")
	}
	return h.memHost.RemovePodRules(a)
}

// TestReleaseRoutelessRemovesRulesFirst: the pod rules of an address whose
// pod went without a DEL go while the address is still held, so no ADD can
// have been given it (B13); a removal that fails keeps the address held,
// and the next check removes and releases it.
func TestReleaseRoutelessRemovesRulesFirst(t *testing.T) {
	store := datastore.New(0)
	now := time.Now()
	store.Cloud().Sync([]provider.ENI{testENI}, now)
	k := api.Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}
	netnsDir := t.TempDir()
	if _, _, err := store.AssignIn(k, api.Pod{Namespace: "default", Name: "p"}, filepath.Join(netnsDir, "cni-c1"), now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	host := &orderProbeHost{memHost: newMemHost(), store: store, fail: true}
	hs := newHostSync(host, config.Config{GCGrace: time.Minute}, store, slog.New(slog.DiscardHandler),
		NewMetrics(prometheus.NewRegistry()), time.Now, []string{netnsDir})
	hs.checkPods(false)
	hs.checkPods(false)
	if _, held := store.Get(k); !held {
		t.Fatal("released though its pod rules could not be removed")
	}
	host.fail = false
	hs.checkPods(false)
	if _, held := store.Get(k); held {
		t.Fatal("still assigned once its pod rules were removed")
	}
	if want := []bool{true, true}; !slices.Equal(host.heldAtRemove, want) {
		t.Errorf("address held at each rule removal: %v, want %v", host.heldAtRemove, want)
	}
}

// assignProbeHost is memHost whose RemovePodRules tries to give the
// address being cleaned to a new pod, as an ADD served meanwhile would.
type assignProbeHost struct {
	*memHost
	store *datastore.Store
	got   []netip.Addr // what the probing ADDs were given
}

func (h *assignProbeHost) RemovePodRules(a netip.Addr) (int, error) {
	k := api.Key{Network: "vpcip", ContainerID: "during-" + a.String(), IfName: "eth0"}
	if asg, _, err := h.store.Assign(k, api.Pod{}, time.Now()); err == nil {
		h.got = append(h.got, asg.Address)
	}
	return h.memHost.RemovePodRules(a)
}

// TestStaleRulesAddressNotHandedOutMeanwhile: while the daemon removes the
// leftover rules of a free address, no ADD can be given that address (its
// new rules would be the ones removed, B13); afterwards it can.
func TestStaleRulesAddressNotHandedOutMeanwhile(t *testing.T) {
	store, stale := oneFreeAddress(t)
	host := &assignProbeHost{memHost: newMemHost(), store: store}
	host.leaveRules(stale)
	hs := newHostSync(host, config.Config{GCGrace: time.Hour}, store, slog.New(slog.DiscardHandler),
		NewMetrics(prometheus.NewRegistry()), time.Now, nil)
	hs.checkPods(false)
	if !slices.Contains(host.rulesRemoved, stale) {
		t.Fatalf("stale rules of %v not removed: %v", stale, host.rulesRemoved)
	}
	if slices.Contains(host.got, stale) {
		t.Errorf("%v was handed out while its stale rules were being removed", stale)
	}
	if a, _, err := store.Assign(api.Key{Network: "vpcip", ContainerID: "after", IfName: "eth0"}, api.Pod{}, time.Now()); err != nil || a.Address != stale {
		t.Errorf("after the removal: %v, %v; want %v", a.Address, err, stale)
	}
}

// oneFreeAddress is a store whose addresses are all held but one, just
// released.
func oneFreeAddress(t *testing.T) (*datastore.Store, netip.Addr) {
	t.Helper()
	store := datastore.New(0)
	now := time.Now()
	store.Cloud().Sync([]provider.ENI{testENI}, now)
	var last netip.Addr
	for i := 0; ; i++ {
		a, _, err := store.Assign(api.Key{Network: "vpcip", ContainerID: fmt.Sprint("c", i), IfName: "eth0"}, api.Pod{}, now)
		if err != nil {
			break
		}
		last = a.Address
	}
	h, ok := store.Holder(last)
	if !ok {
		t.Fatal("setup: no address assigned")
	}
	store.Release(h.Key, now) // its pod went; its rules stay
	return store, last
}

// failingRulesHost is memHost whose pod rules cannot be removed.
type failingRulesHost struct{ *memHost }

func (failingRulesHost) RemovePodRules(netip.Addr) (int, error) {
	return 0, errors.New("netlink: operation not permitted")
}

// TestStaleRulesThatStayKeepTheAddress: a free address whose leftover
// rules cannot be removed is not handed out; once they go, it is.
func TestStaleRulesThatStayKeepTheAddress(t *testing.T) {
	store, stale := oneFreeAddress(t)
	mem := newMemHost()
	mem.leaveRules(stale)
	hs := newHostSync(failingRulesHost{mem}, config.Config{GCGrace: time.Hour}, store, slog.New(slog.DiscardHandler),
		NewMetrics(prometheus.NewRegistry()), time.Now, nil)
	hs.checkPods(false)
	k := api.Key{Network: "vpcip", ContainerID: "next", IfName: "eth0"}
	if a, _, err := store.Assign(k, api.Pod{}, time.Now()); err == nil {
		t.Fatalf("%v handed out with its stale rules in place", a.Address)
	}
	hs.host = mem
	hs.checkPods(false)
	if a, _, err := store.Assign(k, api.Pod{}, time.Now()); err != nil || a.Address != stale {
		t.Errorf("after its rules went: %v, %v; want %v", a.Address, err, stale)
	}
}

// lostAckRulesHost is memHost whose rule removal deletes the rules and then
// reports an error, as when netlink's acknowledgement is lost.
type lostAckRulesHost struct{ *memHost }

func (h lostAckRulesHost) RemovePodRules(a netip.Addr) (int, error) {
	h.memHost.RemovePodRules(a)
	return 0, errors.New("netlink: no acknowledgement")
}

// TestStaleRulesFenceLiftedOnceTheyAreGone: a removal that reported an error
// but deleted the rules (or rules removed by someone else meanwhile) leaves
// the address fenced; the next check, which no longer finds its rules, must
// lift the fence, or the address is lost to the pool until a restart while
// still counted as warm.
func TestStaleRulesFenceLiftedOnceTheyAreGone(t *testing.T) {
	store, stale := oneFreeAddress(t)
	mem := newMemHost()
	mem.leaveRules(stale)
	hs := newHostSync(lostAckRulesHost{mem}, config.Config{GCGrace: time.Hour}, store, slog.New(slog.DiscardHandler),
		NewMetrics(prometheus.NewRegistry()), time.Now, nil)
	hs.checkPods(false)
	k := api.Key{Network: "vpcip", ContainerID: "next", IfName: "eth0"}
	if a, _, err := store.Assign(k, api.Pod{}, time.Now()); err == nil {
		t.Fatalf("%v handed out while its rule removal had failed", a.Address)
	}
	hs.host = mem
	for range 3 {
		hs.checkPods(false)
	}
	if a, _, err := store.Assign(k, api.Pod{}, time.Now()); err != nil || a.Address != stale {
		t.Errorf("after its rules went: %v, %v; want %v", a.Address, err, stale)
	}
}

// lateDELHost is memHost whose RemovePodRules first lets a late DEL of the
// dead key release the address and a new ADD ask for one, as the socket
// server may serve them while the route-less release removes the rules.
type lateDELHost struct {
	*memHost
	store *datastore.Store
	dead  api.Key
	got   []netip.Addr // what the racing ADDs were given
}

func (h *lateDELHost) RemovePodRules(a netip.Addr) (int, error) {
	h.store.Release(h.dead, time.Now())
	k := api.Key{Network: "vpcip", ContainerID: "during-" + a.String(), IfName: "eth0"}
	if asg, _, err := h.store.Assign(k, api.Pod{}, time.Now()); err == nil {
		h.got = append(h.got, asg.Address)
	}
	return h.memHost.RemovePodRules(a)
}

// TestRoutelessReleaseFencedAgainstLateDEL: with IP_COOLDOWN_PERIOD=0 a late
// DEL of a vanished pod's key may release its address while the route-less
// release removes its rules; an ADD served then must not be given the
// address (its new rules would be the ones removed, B13). The address is
// fenced from the check to the removal, and the release does not lift the
// fence; once the rules are gone it is handed out again.
func TestRoutelessReleaseFencedAgainstLateDEL(t *testing.T) {
	store := datastore.New(0)
	now := time.Now()
	store.Cloud().Sync([]provider.ENI{testENI}, now)
	k := api.Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}
	netnsDir := t.TempDir() // the pod's netns file is gone from it
	a, _, err := store.AssignIn(k, api.Pod{Namespace: "default", Name: "p"}, filepath.Join(netnsDir, "cni-c1"), now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	host := &lateDELHost{memHost: newMemHost(), store: store, dead: k}
	hs := newHostSync(host, config.Config{GCGrace: time.Minute}, store, slog.New(slog.DiscardHandler),
		NewMetrics(prometheus.NewRegistry()), time.Now, []string{netnsDir})
	hs.checkPods(false)
	hs.checkPods(false)
	if !slices.Contains(host.rulesRemoved, a.Address) {
		t.Fatalf("setup: the rules of %v were not removed: %v", a.Address, host.rulesRemoved)
	}
	if slices.Contains(host.got, a.Address) {
		t.Errorf("an ADD was given %v while its rules were being removed (late DEL, no cooldown)", a.Address)
	}
	given := false // once the rules are gone the fence is lifted: some ADD gets it
	for i := 0; i < 20 && !given; i++ {
		k2 := api.Key{Network: "vpcip", ContainerID: fmt.Sprintf("after%d", i), IfName: "eth0"}
		b, _, err := store.Assign(k2, api.Pod{}, time.Now())
		if err != nil {
			break
		}
		given = b.Address == a.Address
	}
	if !given {
		t.Errorf("%v never handed out again after its rules were removed: still fenced", a.Address)
	}
}
