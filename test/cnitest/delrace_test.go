package cnitest

import (
	"slices"
	"testing"

	"github.com/vpcip/vpcip/ipamd/api"
)

// TestDELAddressGoesToAnotherPodAtOnce: with no cooldown
// (IP_COOLDOWN_PERIOD=0) the address a DEL releases is handed to the next
// pod the moment the daemon records the release. Whatever the next pod's
// host state looks like then (here its route is gone, deleted by an admin
// as the pod's ADD finished, so nothing on the host says whose the address
// is), the DEL must not touch it: the DEL removes the host state of its
// address while its key still holds it, and only then releases.
func TestDELAddressGoesToAnotherPodAtOnce(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, secondaryENIPool())
	e.Chain = false
	gone := e.NewPod(t, "gone") // .10
	e.MustAdd(t, gone)
	keep := e.NewPod(t, "keep") // .11
	e.MustAdd(t, keep)
	next := e.NewPod(t, "next")
	var nextErr error
	added := false
	d.AfterRelease(func(r api.ReleaseRequest) {
		if r.Key == e.key(gone) && !added {
			nextErr, added = e.Add(t, next), true
			if nextErr == nil {
				ipCmd(t, "-n", e.Node.Name, "route", "del", next.Address.String()+"/32")
			}
		}
	})
	mustDel(t, e, gone)
	d.AfterRelease(nil)
	if !added || nextErr != nil {
		t.Fatalf("ADD of the next pod as the DEL's release was recorded: added %v, %v", added, nextErr)
	}
	if next.Address != gone.Address {
		t.Fatalf("setup: the next pod got %v, want the released %v", next.Address, gone.Address)
	}
	a := mustHeld(t, e, next)
	want := WantRules(next.Address, a.RouteTable)
	if got := PodRules(t, e.Node.Name, next.Address); !slices.Equal(got, want) {
		t.Errorf("the next pod's rules after the DEL of the address's previous holder: %v, want %v", got, want)
	}
	mustDel(t, e, next)
	mustDel(t, e, keep)
	AssertNodeClean(t, e)
}
