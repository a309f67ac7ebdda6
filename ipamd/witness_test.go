package ipamd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/provider"
)

// witnessNode is a store with n assignments older than the GC grace, each
// recording a netns path in nsDir; live lists the pods whose netns file
// exists, routed those the host still routes.
type witnessNode struct {
	store   *datastore.Store
	host    *memHost
	hs      *hostSync
	metrics *Metrics
	keys    []api.Key
}

func newWitnessNode(t *testing.T, n int, nsDir string, dirs []string, live, routed map[int]bool) *witnessNode {
	t.Helper()
	store := datastore.New(0)
	now := time.Now()
	w := &witnessNode{store: store, host: newMemHost(), metrics: NewMetrics(prometheus.NewRegistry())}
	store.Cloud().Sync([]provider.ENI{uniqueIPs(testENI, n)}, now)
	for i := range n {
		k := api.Key{Network: "vpcip", ContainerID: fmt.Sprint("c", i), IfName: "eth0"}
		path := filepath.Join(nsDir, fmt.Sprint("cni-", i))
		if live[i] {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		a, _, err := store.AssignIn(k, api.Pod{Namespace: "default", Name: fmt.Sprint("p", i)}, path, now.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if routed[i] {
			w.host.routes[a.Address] = fmt.Sprint("eni", i)
		}
		w.keys = append(w.keys, k)
	}
	w.hs = newHostSync(w.host, config.Config{GCGrace: time.Minute}, store, slog.New(slog.DiscardHandler), w.metrics, time.Now, dirs)
	return w
}

// uniqueIPs gives e n distinct secondary addresses.
func uniqueIPs(e provider.ENI, n int) provider.ENI {
	e.SecondaryIPs = nil
	a := e.PrimaryIP
	for range n {
		a = a.Next()
		e.SecondaryIPs = append(e.SecondaryIPs, a)
	}
	return e
}

// checks runs the host check k times (two route-less checks release).
func (w *witnessNode) checks(k int) {
	for range k {
		w.hs.checkPods(false)
	}
}

func (w *witnessNode) held(i int) bool {
	_, ok := w.store.Get(w.keys[i])
	return ok
}

// TestWitnessKeepsLivePodWithoutRoute: a pod whose host route was deleted
// (by an admin, a network manager, a stale DEL) while its sandbox lives
// keeps its address, however long the route stays gone. Before the witness
// rule, the only assignment's netns was "not visible" (no routed pod
// showed it) and the address went on the routes' word.
func TestWitnessKeepsLivePodWithoutRoute(t *testing.T) {
	dir := t.TempDir()
	w := newWitnessNode(t, 1, dir, []string{dir}, map[int]bool{0: true}, nil)
	w.checks(5)
	if !w.held(0) {
		t.Fatal("a live sandbox's address was released because its host route is gone")
	}
	if len(w.host.rulesRemoved) != 0 {
		t.Errorf("pod rules of a live pod removed: %v", w.host.rulesRemoved)
	}
}

// TestWitnessBlindReleasesNothing: in a DaemonSet that does not see the
// sandboxes' netns (no mount), a route-less address is never released on
// the routes' word, and the daemon says so (metric 0, status reason,
// introspection). Before: up to half the assignments (at least 2) went.
func TestWitnessBlindReleasesNothing(t *testing.T) {
	nsDir := filepath.Join(t.TempDir(), "not-mounted") // the runtime's dir, absent from the daemon's view
	w := newWitnessNode(t, 2, nsDir, []string{nsDir}, nil, nil)
	w.checks(3)
	for i := range 2 {
		if !w.held(i) {
			t.Errorf("pod %d released on the routes' word without a netns witness", i)
		}
	}
	s, ok := w.hs.witnessState()
	if !ok || s.Available || s.Reason == "" {
		t.Errorf("witness state %+v (known %v); want unavailable with a reason", s, ok)
	}
	if v := testutil.ToFloat64(w.metrics.netnsSeen); v != 0 {
		t.Errorf("vpcip_sandbox_netns_visible = %v, want 0", v)
	}
}

// TestWitnessReleasesAllConfirmedGone: when every pod's sandbox vanishes
// at once (a runtime restart, a node reboot: /run emptied), every address
// whose netns is confirmed gone is released, and a live pod beside them
// keeps its own. Before: with more than half unconfirmed at once, nothing
// at all was released.
func TestWitnessReleasesAllConfirmedGone(t *testing.T) {
	for _, withLive := range []bool{false, true} {
		t.Run(fmt.Sprint("live pod ", withLive), func(t *testing.T) {
			dir := t.TempDir()
			live := map[int]bool{}
			if withLive {
				live[9] = true
			}
			w := newWitnessNode(t, 10, dir, []string{dir}, live, live)
			w.checks(2)
			for i := range 10 {
				if want := live[i]; w.held(i) != want {
					t.Errorf("pod %d: held %v, want %v (sandbox live: %v)", i, w.held(i), want, live[i])
				}
			}
			if v := testutil.ToFloat64(w.metrics.netnsSeen); v != 1 {
				t.Errorf("vpcip_sandbox_netns_visible = %v, want 1", v)
			}
		})
	}
}

// TestWitnessDirFromLiveSandbox: a netns directory not in the configured
// list counts as seen once a routed sandbox's netns is found in it (a
// runtime that mounts netns elsewhere, on a host process).
func TestWitnessDirFromLiveSandbox(t *testing.T) {
	dir := t.TempDir()
	w := newWitnessNode(t, 2, dir, []string{filepath.Join(t.TempDir(), "absent")}, map[int]bool{1: true}, map[int]bool{1: true})
	w.checks(2)
	if w.held(0) {
		t.Error("pod 0's netns is gone from a directory a live sandbox shows is visible; still held")
	}
	s, _ := w.hs.witnessState()
	if !s.Available || len(s.Dirs) != 1 || s.Dirs[0] != dir {
		t.Errorf("witness %+v, want available in %s", s, dir)
	}
}
