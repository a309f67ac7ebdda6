package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// pool is a node's pool counts from vpcipctl status.
type pool struct {
	Assigned, Warm, Cooling, Capacity, Budget int
}

func (s *Scenario) pool(ctx context.Context, n *Node) (pool, error) {
	out, err := n.InNetns(ctx, s.Vpcipctl, "status", "-o", "json")
	if err != nil {
		return pool{}, err
	}
	var st struct {
		Pool pool `json:"pool"`
	}
	if err := jsonUnmarshal(out, &st); err != nil {
		return pool{}, fmt.Errorf("vpcipctl status on %s: %w", n.Name, err)
	}
	return st.Pool, nil
}

// fullNode pins more pods to the first node than its ENIs can ever address:
// the pods it can serve start, and the one left over stays in
// ContainerCreating with an Event that names the cause.
func (s *Scenario) fullNode(ctx context.Context) error {
	n := s.C.Nodes[0]
	p, err := s.pool(ctx, n)
	if err != nil {
		return err
	}
	extra := p.Budget - p.Assigned + 1
	s.Logf("   %s holds %d of at most %d pod addresses; pinning %d more pods to it", n.Name, p.Assigned, p.Budget, extra)
	m, err := s.deployment("filler", extra, n.Name)
	if err != nil {
		return err
	}
	if err := s.C.Apply(ctx, m); err != nil {
		return err
	}
	defer s.C.Kubectl(context.WithoutCancel(ctx), "delete", "deployment", "filler", "--wait=false")
	pods, err := s.C.WaitPods(ctx, "default", "app=filler", 4*time.Minute, "all but one filler pod Running", func(pods []Pod) bool {
		running := 0
		for _, p := range pods {
			if p.Phase == "Running" && p.IP != "" {
				running++
			}
		}
		return len(pods) == extra && running == extra-1
	})
	if err != nil {
		return err
	}
	var stuck Pod
	for _, p := range pods {
		if p.Phase != "Running" {
			stuck = p
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		evs, err := s.C.Events(ctx, "default", stuck.Name)
		for _, e := range evs {
			if strings.Contains(e.Message, "no free address") {
				s.Logf("   pod %s stays %s, its sandbox refused; Event %s %s: %.300s", stuck.Name, stuck.Phase, e.Type, e.Reason, e.Message)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s: no Event naming the cause (%v): %+v", stuck.Name, err, evs)
		}
		time.Sleep(2 * time.Second)
	}
}

// scaleToZero removes every workload pod and checks that each node's daemon
// holds no assignment any more (the addresses are back in its pool).
func (s *Scenario) scaleToZero(ctx context.Context) error {
	if _, err := s.C.Kubectl(ctx, "delete", "deployment", "filler", "--ignore-not-found"); err != nil {
		return err
	}
	if _, err := s.C.Kubectl(ctx, "scale", "deployment", workload, "--replicas=0"); err != nil {
		return err
	}
	if _, err := s.C.WaitPods(ctx, "default", "", 3*time.Minute, "every workload pod gone", func(p []Pod) bool { return len(p) == 0 }); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var held []string
		for _, n := range s.C.Nodes {
			p, err := s.pool(ctx, n)
			if err != nil {
				return err
			}
			if p.Assigned != 0 {
				held = append(held, fmt.Sprintf("%s: %d", n.Name, p.Assigned))
			} else {
				s.Logf("   %s: assigned 0, warm %d, cooling %d", n.Name, p.Warm, p.Cooling)
			}
		}
		if len(held) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("addresses still assigned after scale to 0: %v", held)
		}
		time.Sleep(2 * time.Second)
	}
}

// upgrade runs pods, then `helm upgrade` with a changed warm target: the
// DaemonSet rolls one node at a time (never two daemons unready at once, and
// the second node's new daemon starts after the first one's is ready), the
// running pods keep their addresses and traffic, and the new target is in
// effect on every node.
func (s *Scenario) upgrade(ctx context.Context) error {
	half := s.Pods / 2
	if _, err := s.C.Kubectl(ctx, "scale", "deployment", workload, fmt.Sprintf("--replicas=%d", half)); err != nil {
		return err
	}
	before, err := s.C.WaitPods(ctx, "default", "app="+workload, 3*time.Minute, "pods Running before the upgrade", AllRunning(half))
	if err != nil {
		return err
	}
	old, err := s.C.Pods(ctx, "kube-system", "app.kubernetes.io/name=vpcip")
	if err != nil {
		return err
	}
	watch := s.watchRollout(ctx)
	if _, err := s.C.InstallChart(s.Helm, true, s.Values, "env.WARM_IP_TARGET=8"); err != nil {
		watch.stop()
		return err
	}
	newPods, err := s.C.WaitPods(ctx, "kube-system", "app.kubernetes.io/name=vpcip", 4*time.Minute, "DaemonSet rolled", func(pods []Pod) bool {
		return AllRunning(len(s.C.Nodes))(pods) && disjoint(pods, old)
	})
	worst := watch.stop()
	if err != nil {
		return err
	}
	if worst > 1 {
		return fmt.Errorf("%d daemons were unready at once during the rollout (maxUnavailable rounds to 1 node)", worst)
	}
	if err := nodeByNode(newPods); err != nil {
		return err
	}
	s.Logf("   the DaemonSet rolled node by node (at most one daemon unready at a time)")
	after, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil {
		return err
	}
	if err := sameAddresses(before, after); err != nil {
		return err
	}
	s.Logf("   the %d running pods kept their addresses", len(after))
	if err := s.crossNodePairs(ctx, 3); err != nil {
		return err
	}
	return s.checkConfig(ctx, map[string]string{"WARM_IP_TARGET": "8"})
}

// rolloutWatch samples the daemon pods and records the most that were not
// ready at one time.
type rolloutWatch struct {
	done  chan struct{}
	wg    sync.WaitGroup
	worst int
}

func (s *Scenario) watchRollout(ctx context.Context) *rolloutWatch {
	w := &rolloutWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			if pods, err := s.C.Pods(ctx, "kube-system", "app.kubernetes.io/name=vpcip"); err == nil {
				ready := 0
				for _, p := range pods {
					if p.Ready {
						ready++
					}
				}
				w.worst = max(w.worst, len(s.C.Nodes)-ready)
			}
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *rolloutWatch) stop() int {
	close(w.done)
	w.wg.Wait()
	return w.worst
}

func disjoint(pods, old []Pod) bool {
	for _, p := range pods {
		for _, o := range old {
			if p.UID == o.UID {
				return false
			}
		}
	}
	return true
}

// nodeByNode checks that each new daemon pod was created only after the one
// replaced before it was ready.
func nodeByNode(pods []Pod) error {
	for i := range pods {
		for j := range pods {
			a, b := pods[i], pods[j]
			if a.Created.Before(b.Created) && b.Created.Before(a.ReadySince) {
				return fmt.Errorf("daemon pod %s (%s) was created at %s, before %s (%s) was ready at %s",
					b.Name, b.Node, b.Created.Format(time.TimeOnly), a.Name, a.Node, a.ReadySince.Format(time.TimeOnly))
			}
		}
	}
	return nil
}

func sameAddresses(before, after []Pod) error {
	was := map[string]Pod{}
	for _, p := range before {
		was[p.UID] = p
	}
	var errs []error
	if len(after) != len(before) {
		errs = append(errs, fmt.Errorf("%d pods before the upgrade, %d after", len(before), len(after)))
	}
	for _, p := range after {
		b, ok := was[p.UID]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("pod %s is new after the upgrade", p.Name))
		case b.IP != p.IP || p.Phase != "Running":
			errs = append(errs, fmt.Errorf("pod %s: %s %s before, %s %s after", p.Name, b.IP, b.Phase, p.IP, p.Phase))
		}
	}
	return errors.Join(errs...)
}

// uninstall removes the workload (its DELs need the daemons), then the
// release, and waits until the daemon pods are gone.
func (s *Scenario) uninstall(ctx context.Context) error {
	if _, err := s.C.Kubectl(ctx, "delete", "deployment", workload, "--wait=true", "--timeout=3m"); err != nil {
		return err
	}
	if _, err := s.C.WaitPods(ctx, "default", "", 3*time.Minute, "workload pods gone", func(p []Pod) bool { return len(p) == 0 }); err != nil {
		return err
	}
	out, err := s.C.Helm(s.Helm, "uninstall", Release, "-n", "kube-system", "--wait", "--timeout", "3m")
	if err != nil {
		return err
	}
	s.Logf("%s", indent(strings.TrimSpace(out)))
	_, err = s.C.WaitPods(ctx, "kube-system", "app.kubernetes.io/name=vpcip", 3*time.Minute, "daemon pods gone", func(p []Pod) bool { return len(p) == 0 })
	return err
}
