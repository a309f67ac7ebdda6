package containerd_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// sandboxesPerNode is how many pod sandboxes each node runs at once.
const sandboxesPerNode = 20

// parallelRuns is how many RunPodSandbox calls are in flight at once, as a
// kubelet starting a burst of pods does.
const parallelRuns = 5

// podNetwork is the conflist under test, as the scenarios see it.
type podNetwork interface {
	// Install makes the network available on the node: plugins in its CNI
	// bin dir and the conflist in its conf dir.
	Install(t testing.TB, n *crinode.Node)
	// CheckAttached asserts the sandbox's address came from this network's
	// allocator and is configured in the sandbox.
	CheckAttached(t *testing.T, n *crinode.Node, sb crinode.Sandbox)
	// CheckReleased asserts that nothing of the removed sandboxes is left:
	// addresses back in the pool, no veth, route or rule.
	CheckReleased(t *testing.T, n *crinode.Node, gone []crinode.Sandbox)
}

// checkNotReadyUntilInstalled: before the conflist exists, CRI status shows
// the network not ready and a sandbox cannot start; once it is installed the
// network becomes ready without restarting containerd.
func checkNotReadyUntilInstalled(t *testing.T, n *crinode.Node, pn podNetwork) {
	ctx := context.Background()
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.RuntimeReady || st.NetworkReady {
		t.Fatalf("before the conflist: status %+v, want runtime ready and network not ready", st)
	}
	if _, err := n.RunPodSandbox(ctx, podName("early", 0)); err == nil {
		t.Errorf("a sandbox started before the conflist was installed")
	}
	ids, err := n.PodSandboxIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		sb, err := n.InspectPodSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State == "SANDBOX_READY" {
			t.Errorf("sandbox %s is ready without a network", id)
		}
		n.RemovePodSandbox(ctx, id)
	}
	pn.Install(t, n)
	if _, err := n.WaitNetworkReady(ctx, 15*time.Second); err != nil {
		t.Fatal(err)
	}
}

// runSandboxes starts count sandboxes named prefix-NN, parallelRuns at a
// time, and returns their CRI status in name order. Each must be ready with
// an address no other sandbox of the set has.
func runSandboxes(t *testing.T, n *crinode.Node, prefix string, count int) []crinode.Sandbox {
	t.Helper()
	ctx := context.Background()
	out := make([]crinode.Sandbox, count)
	var g errgroup.Group
	g.SetLimit(parallelRuns)
	for i := range out {
		g.Go(func() error {
			id, err := n.RunPodSandbox(ctx, podName(prefix, i))
			if err != nil {
				return err
			}
			out[i], err = n.InspectPodSandbox(ctx, id)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]string{}
	for _, sb := range out {
		if sb.State != "SANDBOX_READY" || !sb.IP.IsValid() || sb.PID == 0 {
			t.Fatalf("sandbox %s: state %s, ip %v, pid %d; want ready with an address", sb.Pod.Name, sb.State, sb.IP, sb.PID)
		}
		if !strings.HasPrefix(sb.NetnsPath, n.Dir+"/") {
			t.Errorf("sandbox %s: netns %q is not under the node's directory %s", sb.Pod.Name, sb.NetnsPath, n.Dir)
		}
		if other, dup := seen[sb.IP]; dup {
			t.Fatalf("sandboxes %s and %s both have %s", other, sb.Pod.Name, sb.IP)
		}
		seen[sb.IP] = sb.Pod.Name
	}
	return out
}

// checkRestartKeepsSandboxes restarts containerd with the sandboxes running,
// after a clean stop or, with crash, after SIGKILL: afterwards CRI reports
// each with the same address (from containerd's record of the CNI result; no
// new ADD) and still ready.
func checkRestartKeepsSandboxes(t *testing.T, n *crinode.Node, sbs []crinode.Sandbox, crash bool) {
	ctx := context.Background()
	if crash {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, before := range sbs {
		after, err := n.InspectPodSandbox(ctx, before.ID)
		if err != nil {
			t.Fatal(err)
		}
		if after.State != "SANDBOX_READY" || after.IP != before.IP || after.PID != before.PID {
			t.Errorf("%s after restart: state %s ip %v pid %d; before: ip %v pid %d",
				before.Pod.Name, after.State, after.IP, after.PID, before.IP, before.PID)
		}
	}
}

// removeSandboxes stops and removes the sandboxes through CRI, then checks
// that CRI forgot them, their network namespaces are gone and the network
// released everything.
func removeSandboxes(t *testing.T, n *crinode.Node, pn podNetwork, sbs []crinode.Sandbox) {
	t.Helper()
	ctx := context.Background()
	var g errgroup.Group
	g.SetLimit(parallelRuns)
	for _, sb := range sbs {
		g.Go(func() error {
			if err := n.StopPodSandbox(ctx, sb.ID); err != nil {
				return err
			}
			return n.RemovePodSandbox(ctx, sb.ID)
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	ids, err := n.PodSandboxIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, id := range ids {
		left[id] = true
	}
	for _, sb := range sbs {
		if left[sb.ID] {
			t.Errorf("CRI still lists %s after removal", sb.Pod.Name)
		}
		if sb.NetnsPath != "" && exists(sb.NetnsPath) {
			t.Errorf("network namespace %s of %s still exists", sb.NetnsPath, sb.Pod.Name)
		}
	}
	pn.CheckReleased(t, n, sbs)
}

// runLifecycle is the common scenario list for one node: network readiness,
// sandboxesPerNode sandboxes with their addresses checked, traffic between
// two of them, a containerd restart, then removal with nothing left behind.
func runLifecycle(t *testing.T, n *crinode.Node, pn podNetwork) {
	if !t.Run("NetworkNotReadyUntilInstalled", func(t *testing.T) { checkNotReadyUntilInstalled(t, n, pn) }) {
		return
	}
	var sbs []crinode.Sandbox
	if !t.Run("RunSandboxes", func(t *testing.T) {
		sbs = runSandboxes(t, n, "pod", sandboxesPerNode)
		for _, sb := range sbs {
			pn.CheckAttached(t, n, sb)
		}
	}) {
		return
	}
	t.Run("TrafficBetweenSandboxes", func(t *testing.T) {
		exchange(t, sbs[0], sbs[len(sbs)-1])
		exchange(t, sbs[len(sbs)-1], sbs[0])
	})
	t.Run("RestartContainerd", func(t *testing.T) { checkRestartKeepsSandboxes(t, n, sbs, false) })
	t.Run("CrashContainerd", func(t *testing.T) { checkRestartKeepsSandboxes(t, n, sbs, true) })
	t.Run("RemoveSandboxes", func(t *testing.T) { removeSandboxes(t, n, pn, sbs) })
}
