package containerd_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// TestVPCIPConflist runs the scenarios through containerd's CRI with the
// conflist `vpcipd install-cni` writes, on two vpcsim instances: readiness
// only after install-cni, sandboxesPerNode sandboxes per node with addresses
// from the node's pool as the daemon recorded them, traffic across nodes
// through the fabric, a containerd restart and a crash (SIGKILL) with the
// sandboxes running, a removal while vpcipd is down,
// and removal of everything with nothing left behind. On Debian's containerd
// the conflist says cniVersion 1.0.0, on containerd 2 1.1.0.
func TestVPCIPConflist(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, tools crinode.Tools) {
		nodes := startVPCIPCluster(t, tools, 2, "m5.large", "VPCIP_RECONCILE_INTERVAL=5s")
		nets := make([]vpcipNetwork, len(nodes))
		for i, n := range nodes {
			nets[i] = vpcipNetwork{node: n}
		}
		if !t.Run("NetworkNotReadyUntilInstalled", func(t *testing.T) {
			for i, n := range nodes {
				checkNotReadyUntilInstalled(t, n.cri, nets[i])
			}
		}) {
			return
		}
		sbs := make([][]crinode.Sandbox, len(nodes))
		if !t.Run("RunSandboxes", func(t *testing.T) {
			for i, n := range nodes {
				sbs[i] = runSandboxes(t, n.cri, "pod", sandboxesPerNode)
				for _, sb := range sbs[i] {
					nets[i].CheckAttached(t, n.cri, sb)
				}
			}
		}) {
			return
		}
		t.Run("TrafficAcrossNodes", func(t *testing.T) {
			// Pods on the primary ENI and on secondary ENIs, each way, so
			// both the main table and the per-ENI tables carry traffic past
			// the fabric's source/destination check; then two pods on one node.
			a0, a1 := nets[0].sandboxOn(t, sbs[0], false), nets[0].sandboxOn(t, sbs[0], true)
			b0, b1 := nets[1].sandboxOn(t, sbs[1], false), nets[1].sandboxOn(t, sbs[1], true)
			exchange(t, a0, b1)
			exchange(t, b1, a0)
			exchange(t, a1, b0)
			exchange(t, b0, a1)
			exchange(t, a0, a1)
		})
		for _, crash := range []bool{false, true} {
			t.Run(map[bool]string{false: "RestartContainerd", true: "CrashContainerd"}[crash], func(t *testing.T) {
				checkRestartKeepsSandboxes(t, nodes[0].cri, sbs[0], crash)
				for _, sb := range sbs[0] {
					nets[0].CheckAttached(t, nodes[0].cri, sb)
				}
			})
		}
		t.Run("DaemonDownDuringRemoval", func(t *testing.T) {
			checkDaemonDownDuringRemoval(t, nodes[0], nets[0], sbs[0][0])
			sbs[0] = sbs[0][1:]
		})
		t.Run("RemoveSandboxes", func(t *testing.T) {
			for i, n := range nodes {
				removeSandboxes(t, n.cri, nets[i], sbs[i])
			}
		})
	})
}

// checkDaemonDownDuringRemoval stops vpcipd and has containerd stop a
// sandbox: the DEL removes the host side and succeeds (B13), so the stop
// does too and the pod would not stay Terminating. vpcipd, started again,
// releases the address itself (its host check, every
// VPCIP_RECONCILE_INTERVAL: the cluster's daemons run it every 5 s): it
// must end up not holding it, keep it in the node's pool, and leave no
// route, rule or veth. A stop that failed is retried, as the kubelet does.
func checkDaemonDownDuringRemoval(t *testing.T, node *vpcipNode, pn vpcipNetwork, sb crinode.Sandbox) {
	ctx := context.Background()
	node.StopDaemon(false)
	if err := node.cri.StopPodSandbox(ctx, sb.ID); err != nil {
		t.Errorf("StopPodSandbox with vpcipd down: %v; want success (B13: DEL succeeds without the daemon)", err)
	}
	if err := node.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := node.cri.StopPodSandbox(ctx, sb.ID)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("StopPodSandbox still failing a minute after vpcipd restarted: %v", err)
		}
		time.Sleep(time.Second)
	}
	if err := node.cri.RemovePodSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for {
		st := pn.state(t)
		held := slices.ContainsFunc(st.Assignments, func(a introspect.Assignment) bool {
			return a.Address == sb.IP || a.Key.ContainerID == sb.ID
		})
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("vpcipd still holds %s of removed sandbox %s", sb.IP, sb.Pod.Name)
		}
		time.Sleep(time.Second)
	}
	pn.CheckReleased(t, node.cri, []crinode.Sandbox{sb})
}
