package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vpcip/vpcip/test/chart"
	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// Scenario is the cluster walk-through `make demo-cluster` shows and the e2e
// test asserts: install, 40 pods, EC2's view, cross-node traffic,
// AddressBudgets, a full node, scale to 0, a rolling upgrade, uninstall.
type Scenario struct {
	C        *Cluster
	Helm     chart.Helm
	Vpcipctl string // path of vpcipctl on the host, run inside node netns
	Values   string // the user's values file (aws-node style); "" for the chart's defaults
	// ValuesUnder are values files layered under Values at install (`-f`
	// each, Values last).
	ValuesUnder []string
	Pods        int // replicas of the workload; default 40
	Logf        func(format string, args ...any)

	// WantConfig are settings each daemon's effective configuration must
	// show after install (from Values).
	WantConfig map[string]string
}

const workload = "web"

// Run runs every step in order and stops at the first failure.
func (s *Scenario) Run(ctx context.Context) error {
	if s.Pods == 0 {
		s.Pods = 40
	}
	return s.runSteps(ctx, []step{
		{"helm install", s.install},
		{"deploy the workload", s.deploy},
		{"EC2 agrees", s.ec2Agrees},
		{"traffic across nodes", s.crossNode},
		{"netns witness", s.witness},
		{"address budgets", s.budgets},
		{"a full node", s.fullNode},
		{"scale to 0", s.scaleToZero},
		{"rolling upgrade", s.upgrade},
		{"helm uninstall", s.uninstall},
	})
}

// step is one named step of a walk-through.
type step struct {
	name string
	fn   func(context.Context) error
}

// runSteps runs steps in order, logging each one's time, and stops at the
// first failure.
func (s *Scenario) runSteps(ctx context.Context, steps []step) error {
	for _, st := range steps {
		start := time.Now()
		s.Logf("== %s", st.name)
		if err := st.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		s.Logf("   (%s)", time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// install installs the chart and waits until every node's daemon is ready,
// every node Ready, and the effective config shows the user's values.
func (s *Scenario) install(ctx context.Context) error {
	files := slices.Clone(s.ValuesUnder)
	if s.Values != "" {
		files = append(files, s.Values)
	}
	out, err := s.C.InstallChartFiles(s.Helm, false, files)
	if err != nil {
		return err
	}
	s.Logf("%s", indent(strings.TrimSpace(out)))
	if err := s.waitDaemons(ctx, 3*time.Minute); err != nil {
		return err
	}
	if err := s.waitNodesReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	return s.checkConfig(ctx, s.WantConfig)
}

func (s *Scenario) waitDaemons(ctx context.Context, timeout time.Duration) error {
	_, err := s.C.WaitPods(ctx, "kube-system", "app.kubernetes.io/name=vpcip", timeout, "vpcip DaemonSet pods ready", AllRunning(len(s.C.Nodes)))
	if err != nil {
		return fmt.Errorf("%w; kubelet log of %s:\n%s", err, s.C.Nodes[0].Name, tail(s.C.Nodes[0].KubeletLog(), 15))
	}
	out, _ := s.C.Kubectl(ctx, "get", "pods", "-n", "kube-system", "-o", "wide")
	s.Logf("%s", indent(out))
	return nil
}

func (s *Scenario) waitNodesReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, err := s.C.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err == nil && strings.Count(out, "=True") == len(s.C.Nodes) {
			wide, _ := s.C.Kubectl(ctx, "get", "nodes", "-o", "wide")
			s.Logf("%s", indent(wide))
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nodes Ready: %s (%v)", out, err)
		}
		time.Sleep(time.Second)
	}
}

// checkConfig compares each daemon's effective config with want.
func (s *Scenario) checkConfig(ctx context.Context, want map[string]string) error {
	var errs []error
	for _, n := range s.C.Nodes {
		got, err := s.C.DaemonConfig(ctx, n, s.Vpcipctl)
		if err != nil {
			return err
		}
		var shown []string
		for k, v := range want {
			shown = append(shown, k+"="+got[k])
			if got[k] != v {
				errs = append(errs, fmt.Errorf("%s: effective %s=%q, want %q", n.Name, k, got[k], v))
			}
		}
		slices.Sort(shown)
		s.Logf("   %s effective config: %s", n.Name, strings.Join(shown, " "))
	}
	return errors.Join(errs...)
}

func (s *Scenario) pauseImage() (string, error) { return crinode.ImageName(s.C.Tools.PauseArchive) }

// deployment is the workload: pause containers spread over the nodes.
func (s *Scenario) deployment(name string, replicas int, node string) (string, error) {
	image, err := s.pauseImage()
	if err != nil {
		return "", err
	}
	selector := ""
	if node != "" {
		selector = fmt.Sprintf("\n      nodeSelector: {kubernetes.io/hostname: %s}", node)
	}
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: %[2]d
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 1%[4]s
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: %[1]s}}}
      containers:
        - {name: pause, image: %[3]q, imagePullPolicy: Never}
`, name, replicas, image, selector), nil
}

func (s *Scenario) deploy(ctx context.Context) error {
	m, err := s.deployment(workload, s.Pods, "")
	if err != nil {
		return err
	}
	if err := s.C.Apply(ctx, m); err != nil {
		return err
	}
	pods, err := s.C.WaitPods(ctx, "default", "app="+workload, 4*time.Minute, fmt.Sprintf("%d pods Running", s.Pods), AllRunning(s.Pods))
	if err != nil {
		return err
	}
	per := map[string]int{}
	for _, p := range pods {
		per[p.Node]++
	}
	s.Logf("   %d pods Running with addresses: %v", len(pods), per)
	return nil
}

// ec2Agrees checks every pod address is assigned, in vpcsim's EC2 model, to
// an ENI attached to the instance of the pod's node, and no address twice.
func (s *Scenario) ec2Agrees(ctx context.Context) error {
	pods, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil {
		return err
	}
	owner := map[netip.Addr]string{} // address -> instance, from EC2
	for _, e := range s.C.Cloud.NetworkInterfaces() {
		for _, a := range e.SecondaryIPs {
			owner[a] = e.InstanceID
		}
		for _, p := range e.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				owner[a] = e.InstanceID
			}
		}
	}
	seen := map[string]string{}
	var errs []error
	for _, p := range pods {
		a, err := netip.ParseAddr(p.IP)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: address %q", p.Name, p.IP))
			continue
		}
		if other, dup := seen[p.IP]; dup {
			errs = append(errs, fmt.Errorf("pods %s and %s share %s", p.Name, other, p.IP))
		}
		seen[p.IP] = p.Name
		if n := s.C.Node(p.Node); n == nil || owner[a] != n.InstanceID {
			errs = append(errs, fmt.Errorf("pod %s on %s has %s, which EC2 assigns to %q", p.Name, p.Node, a, owner[a]))
		}
	}
	if len(errs) == 0 {
		s.Logf("   EC2 assigns each of the %d pod addresses to an ENI of its pod's node", len(pods))
	}
	return errors.Join(errs...)
}

// podPID returns the pause process of a pod's sandbox, from its node's CRI.
func (s *Scenario) podPID(ctx context.Context, p Pod) (int, error) {
	n := s.C.Node(p.Node)
	if n == nil {
		return 0, fmt.Errorf("pod %s on unknown node %q", p.Name, p.Node)
	}
	ids, err := n.CRI.PodSandboxIDs(ctx)
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		sb, err := n.CRI.InspectPodSandbox(ctx, id)
		if err == nil && sb.Pod.UID == p.UID && sb.State == "SANDBOX_READY" && sb.PID > 0 {
			return sb.PID, nil
		}
	}
	return 0, fmt.Errorf("no running sandbox of pod %s on %s", p.Name, p.Node)
}

// ping sends one echo request from inside pod from to address to.
func (s *Scenario) ping(ctx context.Context, from Pod, to string) error {
	pid, err := s.podPID(ctx, from)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", pid), "--", "ping", "-c", "1", "-W", "3", to).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s -> %s: %v: %s", from.IP, to, err, out)
	}
	return nil
}

// crossNode pings between pods on different nodes, both ways, for up to
// pairs pairs.
func (s *Scenario) crossNode(ctx context.Context) error {
	return s.crossNodePairs(ctx, 5)
}

func (s *Scenario) crossNodePairs(ctx context.Context, pairs int) error {
	pods, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil {
		return err
	}
	byNode := map[string][]Pod{}
	for _, p := range pods {
		byNode[p.Node] = append(byNode[p.Node], p)
	}
	a, b := byNode[s.C.Nodes[0].Name], byNode[s.C.Nodes[1].Name]
	if len(a) == 0 || len(b) == 0 {
		return fmt.Errorf("need pods on both nodes: %d and %d", len(a), len(b))
	}
	n := min(pairs, len(a), len(b))
	for i := range n {
		if err := s.ping(ctx, a[i], b[i].IP); err != nil {
			return err
		}
		if err := s.ping(ctx, b[i], a[i].IP); err != nil {
			return err
		}
	}
	s.Logf("   %d pod pairs across %s and %s ping each other both ways", n, s.C.Nodes[0].Name, s.C.Nodes[1].Name)
	return nil
}

// budgets shows the AddressBudgets, when the chart carries their CRD.
func (s *Scenario) budgets(ctx context.Context) error {
	if _, err := s.C.Kubectl(ctx, "get", "crd", "addressbudgets.vpcip.io"); err != nil {
		s.Logf("   (the chart has no AddressBudget CRD: skipped)")
		return nil
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := s.C.Kubectl(ctx, "get", "addressbudgets")
		every := err == nil
		for _, n := range s.C.Nodes {
			every = every && slices.Contains(strings.Fields(out), n.Name)
		}
		if every {
			s.Logf("%s", indent(out))
			s.Logf("   (USED and SUBNET FREE are published at most once a minute, VPCIP_COUNTS_INTERVAL, so they may lag the daemon's own counts by one change; SUBNET FREE stays empty until the node read its subnets)")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubectl get addressbudgets: want one per node: %s %v", out, err)
		}
		time.Sleep(2 * time.Second)
	}
}

func indent(s string) string {
	return "   " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n   ")
}
