package cnitest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A daemon restarts on an old copy of its checkpoint (a downgrade, another
// build that served meanwhile): it says c1 holds the address that c3, a
// newer pod, now uses. The host routes that address to c3's veth, which
// names c3: restore must take the host's word, so a GC that frees c1's key
// does not hand c3's address to the next pod (issue kind 3).
func TestStaleCheckpointYieldsToTheHost(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	d := v.daemons[0]
	d.Stop(t)
	d.env = append(d.env, "IP_COOLDOWN_PERIOD=0") // a wrongly freed address is handed out at once
	d.Start(t)
	e := NewEnv(t, v.nodes[0], d)
	e.Chain = false
	path := filepath.Join(d.dir, "ipam.json")
	c1 := e.NewPod(t, "old")
	e.MustAdd(t, c1)
	stale, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	mustDel(t, e, c1)
	c3 := e.NewPod(t, "new")
	e.MustAdd(t, c3)
	if c3.Address != c1.Address {
		t.Fatalf("setup: c3 got %v, want c1's %v; log:\n%s", c3.Address, c1.Address, d.log())
	}
	d.Stop(t)
	if err := os.WriteFile(path, stale, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start(t)
	time.Sleep(100 * time.Millisecond)
	if err := e.GC(t, c3); err != nil {
		t.Fatalf("GC: %v", err)
	}
	c4 := e.NewPod(t, "next")
	e.MustAdd(t, c4)
	if c4.Address == c3.Address {
		t.Errorf("c4 was given %v, which live pod c3 uses", c4.Address)
	}
	a := mustHeld(t, e, c3)
	AssertPodWired(t, e, c3, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, c4)
	mustDel(t, e, c3)
}
