package cnitest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// sameSandboxPod is a new sandbox of p's pod: same namespace and name (so
// the same host veth name), its own container ID and netns.
func sameSandboxPod(t testing.TB, e *Env, p *Pod) *Pod {
	q := e.NewPod(t, "x")
	q.Namespace, q.Name = p.Namespace, p.Name
	return q
}

// A repeated, stale DEL of a pod's old sandbox c1, carrying c1's prevResult,
// arrives after c2 (a new sandbox of the same pod, hence the same host veth
// name) got the same address. It exits 0 and leaves c2's veth, route, rules
// and record alone (issue kind 1: a sandbox is known by its container ID,
// which the host veth carries, not by its pod's name).
func TestStaleDELOfOldSandboxKeepsNewSandbox(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(1)) // one address: c2 gets c1's
	c1 := e.NewPod(t, "same")
	e.MustAdd(t, c1)
	stale := e.pluginStdin(t, c1)
	mustDel(t, e, c1)
	DeleteNetns(c1.NetnsName)
	c2 := sameSandboxPod(t, e, c1)
	e.MustAdd(t, c2)
	if c2.Address != c1.Address || e.HostVeth(c2) != e.HostVeth(c1) {
		t.Fatalf("setup: c2 got %v on %s, want c1's %v on %s", c2.Address, e.HostVeth(c2), c1.Address, e.HostVeth(c1))
	}
	if _, stderr, err := e.Exec(t, e.delEnv(c1), stale); err != nil {
		t.Fatalf("stale DEL of c1: %v: %s", err, stderr)
	}
	AssertPodWired(t, e, c2, 0, 9001)
	if a, ok := d.Held()[e.key(c2)]; !ok || a.Address != c2.Address {
		t.Errorf("daemon record of c2: %+v (held %v), want %v", a, ok, c2.Address)
	}
	if err := e.Check(t, c2); err != nil {
		t.Errorf("CHECK c2 after the stale DEL of c1: %v", err)
	}
	mustDel(t, e, c2)
	AssertNodeClean(t, e)
}

// After a lost checkpoint the daemon re-holds a live sandbox's address from
// its host route under a placeholder. A late DEL for an older sandbox of the
// same pod (same host veth name) must not adopt that placeholder and free
// it: the live sandbox stays wired, its own CHECK adopts the address, and no
// other pod is given it (issue kind 2).
func TestLateDELOfOldSandboxAfterLostCheckpoint(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	node, d := v.nodes[0], v.daemons[0]
	e := NewEnv(t, node, d)
	e.Chain = false
	s1 := e.NewPod(t, "crashy")
	e.MustAdd(t, s1)
	s1Stale := e.pluginStdin(t, s1)
	// The runtime restarted and made s2 without a DEL of s1.
	s2 := sameSandboxPod(t, e, s1)
	e.MustAdd(t, s2)
	d.Stop(t)
	if err := os.WriteFile(filepath.Join(d.dir, "ipam.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.env = append(d.env, "IP_COOLDOWN_PERIOD=0") // a wrongly freed address would be handed out at once
	d.Start(t)
	if _, stderr, err := e.Exec(t, e.delEnv(s1), s1Stale); err != nil {
		t.Fatalf("late DEL of s1: %v: %s", err, stderr)
	}
	if err := e.Check(t, s2); err != nil { // adopts s2's placeholder by its veth
		t.Errorf("CHECK s2: %v", err)
	}
	a := mustHeld(t, e, s2)
	AssertPodWired(t, e, s2, a.RouteTable, mtuOf(e, a))
	others := make([]*Pod, 0, 8)
	for range 8 {
		p := e.NewPod(t, "next")
		e.MustAdd(t, p)
		if p.Address == s2.Address {
			t.Fatalf("pod %s was given %v, which live sandbox s2 uses", p.Name, p.Address)
		}
		others = append(others, p)
	}
	for _, p := range append(others, s2) {
		mustDel(t, e, p)
	}
}

// GC takes the runtime's valid attachments under either name runtimes sent
// while CNI 1.1 settled: cni.dev/valid-attachments or cni.dev/attachments.
func TestGCAcceptsAttachmentsKey(t *testing.T) {
	RequireRoot(t)
	for _, field := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		t.Run(field, func(t *testing.T) {
			e, d := fakeEnv(t, FakePool(4))
			keep, drop := e.NewPod(t, "keep"), e.NewPod(t, "drop")
			e.MustAdd(t, keep)
			e.MustAdd(t, drop)
			c := e.PluginConf()
			c["cniVersion"], c["name"] = "1.1.0", Network
			c[field] = []map[string]string{{"containerID": keep.ContainerID, "ifname": keep.IfName}}
			stdin, _ := json.Marshal(c)
			if _, stderr, err := e.Exec(t, map[string]string{"CNI_COMMAND": "GC"}, stdin); err != nil {
				t.Fatalf("GC with %s: %v: %s", field, err, stderr)
			}
			held := d.Held()
			if _, ok := held[e.key(keep)]; !ok {
				t.Errorf("GC released %s, which %s lists", keep.Name, field)
			}
			if _, ok := held[e.key(drop)]; ok {
				t.Errorf("GC kept %s, which %s does not list", drop.Name, field)
			}
			AssertHostSideGone(t, e, drop, drop.Address)
			AssertPodWired(t, e, keep, 0, 9001)
			mustDel(t, e, keep)
			DeleteNetns(drop.NetnsName) // its sandbox is gone, as GC assumed
		})
	}
}

// A stale DEL of c1 (key unknown to the daemon, netns gone, prevResult
// naming address A) arrives while A is another pod's, c2, whose host route
// is missing (its ADD made the rules but not yet the route, or an admin
// deleted it). The DEL exits 0 and leaves c2's policy rules: they are not
// c1's to remove (#25 kind 1; before, it deleted every rule of A).
func TestStaleDELLeavesRulesOfAnAddressWithoutRoute(t *testing.T) {
	staleDELOverARoutelessAddress(t, false)
}

// TestStaleDELDaemonDownLeavesRulesOfAnAddressWithoutRoute: the same
// stale DEL with vpcipd down succeeds (B13) and still leaves c2's rules:
// an address known from prevResult alone is this DEL's only where its
// host route leads to this attachment's veth.
func TestStaleDELDaemonDownLeavesRulesOfAnAddressWithoutRoute(t *testing.T) {
	staleDELOverARoutelessAddress(t, true)
}

// staleDELOverARoutelessAddress runs the two tests above, with the daemon
// up or down during the stale DEL.
func staleDELOverARoutelessAddress(t *testing.T, daemonDown bool) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(1)) // one address: c2 gets c1's
	e.Chain = false
	c1 := e.NewPod(t, "first")
	e.MustAdd(t, c1)
	stale := e.pluginStdin(t, c1)
	mustDel(t, e, c1)
	DeleteNetns(c1.NetnsName)
	c2 := e.NewPod(t, "second")
	e.MustAdd(t, c2)
	if c2.Address != c1.Address {
		t.Fatalf("setup: c2 got %v, want c1's %v", c2.Address, c1.Address)
	}
	a := mustHeld(t, e, c2)
	want := WantRules(c2.Address, a.RouteTable)
	ipCmd(t, "-n", e.Node.Name, "route", "del", c2.Address.String()+"/32")
	if daemonDown {
		d.Stop(t)
	}
	if _, stderr, err := e.Exec(t, e.delEnv(c1), stale); err != nil {
		t.Fatalf("stale DEL of c1 (daemon down: %v): %v: %s", daemonDown, err, stderr)
	}
	if got := PodRules(t, e.Node.Name, c2.Address); !slices.Equal(got, want) {
		t.Errorf("c2's rules after the stale DEL of c1 (daemon down: %v): %v, want %v", daemonDown, got, want)
	}
	if daemonDown {
		d.Start(t)
	}
	if _, ok := d.Held()[e.key(c2)]; !ok {
		t.Errorf("daemon no longer holds c2's %v", c2.Address)
	}
	ipCmd(t, "-n", e.Node.Name, "route", "replace", c2.Address.String()+"/32", "dev", e.HostVeth(c2), "scope", "link")
	mustDel(t, e, c2)
	AssertNodeClean(t, e)
}

// TestAnotherSandboxsInterfaceIsLeftAlone: the pod interface in a netns is
// its sandbox's. A DEL of a container never added (c9) that names c1's
// netns exits 0 and leaves c1's interface, veth, route, rules and record;
// an ADD of another container (c8) into c1's netns under the same ifname
// fails with code 4 naming CNI_IFNAME (CNI spec 1.1 §ADD: an interface of
// that name already exists) and leaves c1 as it was, c8 holding nothing.
// Both used to delete c1's eth0, and the DEL c1's route and rules too.
func TestAnotherSandboxsInterfaceIsLeftAlone(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(3))
	c1 := e.NewPod(t, "own")
	e.MustAdd(t, c1)
	c9 := e.NewPod(t, "never")
	c9.NetnsName, c9.NetnsPath = c1.NetnsName, c1.NetnsPath
	if err := e.Del(t, c9); err != nil {
		t.Fatalf("DEL of c9 naming c1's netns: %v", err)
	}
	AssertPodWired(t, e, c1, 0, 9001)
	if err := e.Check(t, c1); err != nil {
		t.Errorf("CHECK c1 after c9's DEL: %v", err)
	}
	c8 := e.NewPod(t, "intruder")
	c8.NetnsName, c8.NetnsPath = c1.NetnsName, c1.NetnsPath
	err := e.Add(t, c8)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(te.Msg, "CNI_IFNAME eth0") {
		t.Fatalf("ADD of c8 into c1's netns: %v; want code 4 naming CNI_IFNAME", err)
	}
	AssertPodWired(t, e, c1, 0, 9001)
	if err := e.Check(t, c1); err != nil {
		t.Errorf("CHECK c1 after c8's ADD: %v", err)
	}
	if a, ok := d.Held()[e.key(c8)]; ok {
		t.Errorf("c8 holds %v after its failed ADD", a.Address)
	}
	if a, ok := d.Held()[e.key(c1)]; !ok || a.Address != c1.Address {
		t.Errorf("daemon record of c1: %+v (held %v), want %v", a, ok, c1.Address)
	}
	mustDel(t, e, c1)
	AssertNodeClean(t, e)
}
