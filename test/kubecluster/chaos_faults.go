package kubecluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// The campaign's faults: how each kind is injected and undone.

// inject runs the faults one after another: a random pause of churn, the
// fault on a random node, recovery (daemons and nodes ready, the API
// server answering), then a clean sample of every invariant within Settle.
func (ch *Chaos) inject(ctx context.Context) error {
	for i, kind := range ch.plan() {
		node := ch.S.C.Nodes[ch.rng.IntN(len(ch.S.C.Nodes))]
		time.Sleep(ch.Pause/5 + time.Duration(ch.rng.Int64N(int64(ch.Pause))))
		began := time.Now()
		detail, err := ch.fault(ctx, kind, node)
		if err != nil {
			return fmt.Errorf("fault %d (%s on %s): %w", i+1, kind, node.Name, err)
		}
		injected := time.Since(began)
		where := " on " + node.Name
		if kind == FaultStopAPIServer || kind == FaultEC2 || kind == FaultUpgrade {
			where = "" // not a node's
		}
		if err := ch.recover(ctx); err != nil {
			return fmt.Errorf("after fault %d (%s%s%s): %w", i+1, kind, where, detail, err)
		}
		recovered := time.Since(began)
		if err := ch.settle(ctx, time.Now()); err != nil {
			return fmt.Errorf("after fault %d (%s%s%s): %w", i+1, kind, where, detail, err)
		}
		if err := ch.hardError(); err != nil {
			return err
		}
		took := time.Since(began)
		ch.mu.Lock()
		ch.faults[kind]++
		ch.cost[kind] = append(ch.cost[kind], faultCost{Fault: injected, Recovered: recovered, Total: took})
		ch.mu.Unlock()
		ch.Logf("   fault %d/%d: %s%s%s; over after %s, recovered after %s, invariants hold after %s",
			i+1, ch.Faults, kind, where, detail, injected.Round(100*time.Millisecond), recovered.Round(100*time.Millisecond), took.Round(100*time.Millisecond))
	}
	return nil
}

// fault injects one fault and returns once it is over (the process
// restarted, the API server back, EC2 healthy again).
func (ch *Chaos) fault(ctx context.Context, kind string, n *Node) (string, error) {
	c := ch.S.C
	switch kind {
	case FaultKillDaemon:
		pid, err := daemonPID(n)
		if err != nil {
			return "", err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return "", fmt.Errorf("kill %d: %w", pid, err)
		}
		killed := time.Now()
		err = newDaemon(ctx, n, pid)
		return fmt.Sprintf(" (pid %d; a new vpcipd %s later)", pid, time.Since(killed).Round(100*time.Millisecond)), err
	case FaultRestartContainerd:
		return "", n.CRI.Restart(ctx)
	case FaultRestartKubelet:
		return "", c.RestartKubelet(n)
	case FaultStopAPIServer:
		down := time.Duration(1+ch.rng.Int64N(int64(ch.APIDownMax/time.Second))) * time.Second
		ch.apiReq.sample(ctx, c) // the daemons' count up to now: a new API server counts from 0
		c.API.StopAPIServer()
		time.Sleep(down)
		if err := c.API.StartAPIServer(); err != nil {
			return "", err
		}
		return fmt.Sprintf(" for %s", down), nil
	case FaultReboot:
		keep := ch.rng.IntN(2) == 0
		how := " (/run emptied, checkpoint lost)"
		if keep {
			how = " (/run emptied but the checkpoint kept)"
		}
		pid, _ := daemonPID(n)
		if err := c.Reboot(ctx, n, keep); err != nil {
			return "", err
		}
		return how, newDaemon(ctx, n, pid)
	case FaultUpgrade:
		return ch.upgradeRollback(ctx)
	case FaultEC2:
		f := c.Cloud.Faults()
		rate := 0.2 + 0.6*ch.rng.Float64()
		window := time.Duration(5+ch.rng.Int64N(int64(ch.EC2Window/time.Second))) * time.Second
		f.SetThrottle(true, 0.5, 1)
		f.SetThrottle(false, 2, 2)
		f.SetErrorRate(vpcsim.AnyOp, rate, "InternalError")
		// Demand addresses while EC2 fails: scale a Deployment up now.
		ch.scale(ctx, churnA, 4+ch.rng.IntN(6))
		time.Sleep(window)
		f.SetErrorRate(vpcsim.AnyOp, 0, "")
		f.SetThrottle(true, 0, 0)
		f.SetThrottle(false, 0, 0)
		return fmt.Sprintf(" (%.0f%% InternalError, throttled, for %s)", rate*100, window), nil
	}
	return "", fmt.Errorf("unknown fault kind %q", kind)
}

// upgradeRollback upgrades the release to UpgradeImage, waits a random
// part (0 to 8 Pause) of its rollout, rolls back and waits for the rollback's rollout.
// It returns which version each node's daemon ran at the rollback.
func (ch *Chaos) upgradeRollback(ctx context.Context) (string, error) {
	c := ch.S.C
	name, err := crinode.ImageName(ch.UpgradeImage)
	if err != nil {
		return "", err
	}
	tag := name[strings.LastIndexByte(name, ':')+1:]
	if _, err := c.InstallChart(ch.S.Helm, true, ch.S.Values, "image.tag="+tag); err != nil {
		return "", err
	}
	time.Sleep(time.Duration(ch.rng.Int64N(int64(8 * ch.Pause))))
	var ran []string
	for _, n := range c.Nodes {
		v := "down"
		if st, err := ch.S.daemonState(ctx, n); err == nil {
			v = st.Node.Version
		}
		ran = append(ran, n.Name+"="+v)
	}
	if _, err := c.Helm(ch.S.Helm, "rollback", Release, "-n", "kube-system"); err != nil {
		return "", err
	}
	ds, err := c.Kubectl(ctx, "get", "daemonset", "-n", "kube-system", "-l", "app.kubernetes.io/name=vpcip", "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil {
		return "", err
	}
	if _, err := c.Kubectl(ctx, "rollout", "status", "-n", "kube-system", "daemonset/"+ds, "--timeout=10m"); err != nil {
		return "", err
	}
	return fmt.Sprintf(" (to %s; at the rollback: %s)", tag, strings.Join(ran, " ")), nil
}

// daemonPID finds the vpcipd daemon process of node n: the process whose
// command line is the DaemonSet's vpcipd container command (the install-cni
// container runs vpcipd with arguments) in the node's network namespace.
func daemonPID(n *Node) (int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/var/run/netns", n.Netns), &want); err != nil {
		return 0, err
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || string(cmd) != "/usr/local/bin/vpcipd\x00" {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", p.Name(), "ns", "net"), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no vpcipd daemon process in %s's netns", n.Name)
}

// newDaemon waits until kubelet has started a vpcipd daemon process on n
// other than old (its restart back-off grows with each kill, up to 5 min
// unless the cluster's RestartBackOffMax caps it).
func newDaemon(ctx context.Context, n *Node, old int) error {
	deadline := time.Now().Add(7 * time.Minute)
	for {
		pid, err := daemonPID(n)
		if err == nil && pid != old {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no new vpcipd on %s after %s (%v)", n.Name, 7*time.Minute, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
