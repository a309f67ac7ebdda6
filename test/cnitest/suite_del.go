package cnitest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

// testDelNetnsGone is B25: DEL succeeds and releases when the netns was
// removed, and when its path is left as a regular file.
func testDelNetnsGone(t *testing.T, e *Env) {
	for _, variant := range []string{"removed", "regular file"} {
		p := e.NewPod(t, "gone")
		e.MustAdd(t, p)
		DeleteNetns(p.NetnsName)
		if variant == "regular file" {
			p.NetnsPath = filepath.Join(t.TempDir(), "netns")
			if err := os.WriteFile(p.NetnsPath, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Del(t, p); err != nil {
			t.Errorf("%s: DEL with the netns %s: %v", variant, variant, err)
		}
		if _, ok := e.Held(t, p); ok {
			t.Errorf("%s: daemon still holds %s", variant, p.Name)
		}
		AssertHostSideGone(t, e, p, p.Address)
	}
}

// testDelEmptyNetns is B01: DEL with CNI_NETNS="" still releases and removes
// the host side, and again exits 0 with nothing on stdout.
func testDelEmptyNetns(t *testing.T, e *Env) {
	p := e.NewPod(t, "nonetns")
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	p.NetnsPath = ""
	mustDel(t, e, p)
	if _, ok := e.Held(t, p); ok {
		t.Errorf("daemon still holds %v after DEL without netns", a.Address)
	}
	AssertHostSideGone(t, e, p, a.Address)
	stdout, _, err := e.Exec(t, e.delEnv(p), e.pluginStdin(t, nil))
	if err != nil || len(stdout) != 0 {
		t.Errorf("second DEL: err %v stdout %q, want success and empty stdout", err, stdout)
	}
}

// delEnv is the environment of a DEL of p run directly.
func (e *Env) delEnv(p *Pod) map[string]string {
	return map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": p.ContainerID, "CNI_NETNS": p.NetnsPath,
		"CNI_IFNAME": p.IfName, "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + p.Namespace + ";K8S_POD_NAME=" + p.Name}
}

// pluginStdin is vpcip-cni's config alone as the runtime sends it, with
// prevResult when given.
func (e *Env) pluginStdin(t testing.TB, prev *Pod) []byte {
	t.Helper()
	c := e.PluginConf()
	c["cniVersion"], c["name"] = e.CNIVersion, Network
	if prev != nil && prev.Result != nil {
		r, err := prev.Result.GetAsVersion(e.CNIVersion)
		if err != nil {
			t.Fatal(err)
		}
		c["prevResult"] = r
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testDelUnknown is B14: DEL of a container never added exits 0, with and
// without a netns, and leaves another pod's state exactly as it was.
func testDelUnknown(t *testing.T, e *Env) {
	other := e.NewPod(t, "bystander")
	e.MustAdd(t, other)
	before := snapshot(t, e, other)
	ghost := e.NewPod(t, "ghost")
	for _, netns := range []string{"", ghost.NetnsPath} {
		ghost.NetnsPath = netns
		stdout, stderr, err := e.Exec(t, e.delEnv(ghost), e.pluginStdin(t, nil))
		if err != nil || len(stdout) != 0 {
			t.Errorf("DEL unknown container (netns %q): %v stdout %q stderr %q", netns, err, stdout, stderr)
		}
	}
	// The same pod name as the bystander, another sandbox: a stale DEL.
	stale := *other
	stale.ContainerID = randomHex(32)
	stale.NetnsPath = ""
	if stdout, _, err := e.Exec(t, e.delEnv(&stale), e.pluginStdin(t, nil)); err != nil || len(stdout) != 0 {
		t.Errorf("DEL of an unknown sandbox of the same pod: %v %q", err, stdout)
	}
	if diff := cmp.Diff(before, snapshot(t, e, other)); diff != "" {
		t.Errorf("bystander's state changed (-before +after):\n%s", diff)
	}
	if err := e.Check(t, other); err != nil {
		t.Errorf("CHECK bystander: %v", err)
	}
	mustDel(t, e, other)
}

// snapshot is a pod's node-side state in comparable form.
func snapshot(t testing.TB, e *Env, p *Pod) []string {
	t.Helper()
	out := PodRules(t, e.Node.Name, p.Address)
	if r, ok := HostRoute(t, e.Node.Name, p.Address); ok {
		out = append(out, "route "+r.Dev+" "+r.Scope)
	}
	if l, ok := linkNamed(t, e.Node.Name, e.HostVeth(p)); ok {
		out = append(out, "veth "+l.IfName+" "+l.Address)
	}
	if a, ok := e.Held(t, p); ok {
		out = append(out, "held "+a.Address.String())
	}
	return out
}

// testDelDaemonStopped is B13: with the daemon down, DEL removes the host
// side at once (prevResult from the runtime's cache) and succeeds, so the
// runtime can finish the sandbox; STATUS answers 50; the daemon keeps the
// address while down, and once it is back a GC that no longer lists the
// attachment (the runtime forgot it with the DEL) releases the address.
func testDelDaemonStopped(t *testing.T, e *Env) {
	p := e.NewPod(t, "daemondown")
	e.MustAdd(t, p)
	added := time.Now()
	a := mustHeld(t, e, p)
	e.Daemon.Stop(t)
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			e.Daemon.Start(t)
		}
	})
	if err := e.Status(t); CNICode(err) != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with the daemon down: %v (code %d), want code 50", err, CNICode(err))
	}
	if err := e.Del(t, p); err != nil {
		t.Errorf("DEL with the daemon down: %v (code %d), want success", err, CNICode(err))
	}
	AssertHostSideGone(t, e, p, a.Address)
	e.Daemon.Start(t)
	restarted = true
	if _, ok := e.Held(t, p); !ok {
		t.Fatalf("daemon lost %s's assignment while it was down", p.Name)
	}
	waitGCGrace(e, added)
	if err := e.GC(t); err != nil {
		t.Errorf("GC after the daemon returned: %v", err)
	}
	if _, ok := e.Held(t, p); ok {
		t.Errorf("daemon still holds %v after GC", a.Address)
	}
	AssertHostSideGone(t, e, p, a.Address)
}

// testDelDaemonStoppedNoPrevResult: without prevResult the pod interface
// tells the address, and DEL succeeds (B13); without netns either nothing
// local does, so the host side stays and DEL fails with code 11 until a
// retried DEL reaches the daemon, which then removes it.
func testDelDaemonStoppedNoPrevResult(t *testing.T, e *Env) {
	p, q := e.NewPod(t, "noprev"), e.NewPod(t, "noprev-nonetns")
	e.MustAdd(t, p)
	e.MustAdd(t, q)
	qa := mustHeld(t, e, q)
	e.Daemon.Stop(t)
	if out, _, err := e.Exec(t, e.delEnv(p), e.pluginStdin(t, nil)); err != nil {
		t.Errorf("DEL with the daemon down: %v %s; want success (B13)", err, out)
	}
	AssertHostSideGone(t, e, p, p.Address)
	q.NetnsPath = ""
	if _, _, err := e.Exec(t, e.delEnv(q), e.pluginStdin(t, nil)); err == nil {
		t.Errorf("DEL without netns or prevResult, daemon down, succeeded; want code 11: nothing local knows the pod's host side, so the runtime must retry")
	}
	if got := PodRules(t, e.Node.Name, qa.Address); !slices.Equal(got, WantRules(qa.Address, qa.RouteTable)) {
		t.Errorf("rules of %v changed without any knowledge of the address: %v", qa.Address, got)
	}
	e.Daemon.Start(t)
	mustDel(t, e, p)
	mustDel(t, e, q)
	for _, x := range []*Pod{p, q} {
		if _, ok := e.Held(t, x); ok {
			t.Errorf("daemon still holds %s after the retried DEL", x.Name)
		}
		AssertHostSideGone(t, e, x, x.Address)
	}
}

// waitGCGrace waits until an assignment made at added is old enough for
// the daemon's GC to release it (a daemon without GCGrace releases at once).
func waitGCGrace(e *Env, added time.Time) {
	if g, ok := e.Daemon.(interface{ GCGrace() time.Duration }); ok {
		time.Sleep(time.Until(added.Add(g.GCGrace() + 100*time.Millisecond)))
	}
}

// testGC: the runtime lost track of one attachment (its cache is gone, as
// after a kill -9 between the daemon's answer and the result); GC with the
// other two as valid releases it and removes its host side, and leaves the
// valid ones working.
func testGC(t *testing.T, e *Env) {
	p1, p3 := e.NewPod(t, "gc1"), e.NewPod(t, "gc3")
	e.MustAdd(t, p1)
	lostEnv := *e
	lostEnv.CacheDir = t.TempDir()
	lost := lostEnv.NewPod(t, "gc2")
	lostEnv.MustAdd(t, lost)
	added := time.Now()
	e.MustAdd(t, p3)
	la := mustHeld(t, e, lost)
	waitGCGrace(e, added)
	if err := e.GC(t, p1, p3); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, ok := e.Held(t, lost); ok {
		t.Errorf("GC left %v assigned to an attachment not in the valid list", la.Address)
	}
	AssertHostSideGone(t, e, lost, la.Address)
	for _, p := range []*Pod{p1, p3} {
		a := mustHeld(t, e, p)
		AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
		if err := e.Check(t, p); err != nil {
			t.Errorf("CHECK %s after GC: %v", p.Name, err)
		}
	}
	AssertNodeClean(t, e, p1, p3)
	mustDel(t, e, p1)
	mustDel(t, e, p3)
}

// testDelCorruptCache is B34: the runtime's cached result for the pod is
// empty (a reboot mid-write) or of another version; DEL still succeeds,
// releases, and removes the host side, and the other pod is untouched.
func testDelCorruptCache(t *testing.T, e *Env) {
	other := e.NewPod(t, "intact")
	e.MustAdd(t, other)
	before := snapshot(t, e, other)
	for _, content := range []string{"", `{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.1/32"}}`} {
		p := e.NewPod(t, "corrupt")
		e.MustAdd(t, p)
		cache := filepath.Join(e.CacheDir, "results", Network+"-"+p.ContainerID+"-"+p.IfName)
		if _, err := os.Stat(cache); err != nil {
			t.Fatalf("libcni cache entry: %v", err)
		}
		if err := os.WriteFile(cache, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := e.Del(t, p); err != nil {
			t.Errorf("DEL with cache %q: %v", content, err)
		}
		if _, ok := e.Held(t, p); ok {
			t.Errorf("cache %q: daemon still holds %v", content, p.Address)
		}
		AssertHostSideGone(t, e, p, p.Address)
	}
	if diff := cmp.Diff(before, snapshot(t, e, other)); diff != "" {
		t.Errorf("other pod changed (-before +after):\n%s", diff)
	}
	mustDel(t, e, other)
}
