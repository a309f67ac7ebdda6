package cnitest

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func fakeEnv(t *testing.T, pool []FakeAddress) (*Env, *FakeDaemon) {
	node := NewNode(t)
	d := NewFakeDaemon(t, pool, 9001)
	return NewEnv(t, node, d), d
}

// TestSuiteFakeDaemon runs the plugin contract against the protocol double
// (a fresh node netns per test). The same suite runs against vpcipd on
// vpcsim in vpcipd_test.go.
func TestSuiteFakeDaemon(t *testing.T) {
	RequireRoot(t)
	RunSuite(t, Setup{NewEnv: func(t *testing.T) *Env {
		e, _ := fakeEnv(t, FakePool(64))
		return e
	}})
}

// TestNotReady: until the daemon is ready STATUS answers 50 with its reason
// and ADD answers 11 with the daemon's message; both succeed after.
func TestNotReady(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(4))
	d.SetReady(false)
	err := e.Status(t)
	if CNICode(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "restoring checkpoint") {
		t.Errorf("STATUS not ready: %v, want code 50 with the daemon's reason", err)
	}
	p := e.NewPod(t, "early")
	err = e.Add(t, p)
	if CNICode(err) != types.ErrTryAgainLater || !strings.Contains(err.Error(), "vpcipd is restoring its state") {
		t.Errorf("ADD not ready: %v, want code 11 with the daemon's message", err)
	}
	d.SetReady(true)
	if err := e.Status(t); err != nil {
		t.Errorf("STATUS ready: %v", err)
	}
	e.MustAdd(t, p)
	// A DEL while the daemon restores its state removes the host side and
	// succeeds (B13); the daemon keeps the address until it can release
	// it (here a DEL once it is ready; in production also its host check).
	d.SetReady(false)
	if err := e.Del(t, p); err != nil {
		t.Errorf("DEL not ready: %v (code %d), want success with the host side removed", err, CNICode(err))
	}
	AssertHostSideGone(t, e, p, p.Address)
	if _, held := d.Held()[e.key(p)]; !held {
		t.Errorf("the not-ready daemon released anyway")
	}
	d.SetReady(true)
	mustDel(t, e, p)
	if _, held := d.Held()[e.key(p)]; held {
		t.Errorf("a DEL once ready did not release")
	}
	AssertNodeClean(t, e)
}

// TestNoAddress: an exhausted pool gives code 11 carrying the daemon's
// cause word for word, and nothing is left behind.
func TestNoAddress(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(1))
	p1, p2 := e.NewPod(t, "first"), e.NewPod(t, "second")
	e.MustAdd(t, p1)
	err := e.Add(t, p2)
	want := "no free address: node at its ENI limit (2 of 2) and all 1 addresses assigned"
	if CNICode(err) != types.ErrTryAgainLater || !strings.Contains(err.Error(), want) {
		t.Errorf("ADD with no address: %v (code %d); want code 11 with %q", err, CNICode(err), want)
	}
	if got := len(d.Held()); got != 1 {
		t.Errorf("daemon holds %d assignments, want 1", got)
	}
	AssertNodeClean(t, e, p1)
	mustDel(t, e, p1)
	AssertNodeClean(t, e)
}

// TestDELKeepsAnotherPodsWiringOnAWrongRecord: when the daemon's record for
// the deleted pod names another live pod's address (a damaged checkpoint),
// DEL removes only its own pod's host state: the other pod stays wired.
func TestDELKeepsAnotherPodsWiringOnAWrongRecord(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(4))
	alpha, beta := e.NewPod(t, "alpha"), e.NewPod(t, "beta")
	e.MustAdd(t, alpha)
	e.MustAdd(t, beta)
	own := beta.Address
	d.SetHeldAddress(e.key(beta), alpha.Address)
	mustDel(t, e, beta)
	AssertPodWired(t, e, alpha, 0, 9001)
	AssertHostSideGone(t, e, beta, own)
	mustDel(t, e, alpha)
	AssertNodeClean(t, e)
}
