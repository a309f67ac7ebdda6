// Package fleet runs a fleet of vpcipd daemons against one vpcsim cloud and
// one real kube-apiserver, and measures what the fleet asks of both: how
// long each pod waits for its address, the EC2 requests by action and by
// node (accepted and throttled by the account's request buckets), the API
// server's requests per node and minute by verb and resource, and each
// daemon's CPU time and resident memory.
//
// A node is as light as a daemon allows: an instance netns of vpcsim's
// fabric (its own source address, so its own IMDS identity and ENIs), a
// Node object, and one vpcipd with host networking off (VPCIP_HOSTNET=false:
// it keeps its ENIs and addresses in EC2 and its datastore but wires
// nothing in the netns) and its metrics and introspection listeners off.
// No kubelet runs: the harness creates pods already bound to their node, as
// the scheduler leaves them, and plays the plugin's side of CNI ADD and DEL
// through the daemon's socket API (ipamd/api).
//
// The control plane, the daemons and the harness each get their own CPU
// share (cpugroup.go), as on a cluster whose API server runs on machines of
// its own; Options.SharedCPU turns that off.
//
// It does not import testing; the tests and `make fleet` drive it.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/chart"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// apiAddr is where the API server is reachable from inside instance netns:
// a relay in the fabric's router netns.
const apiAddr = fabric.MetadataAddr + ":6443"

// Options shape a fleet.
type Options struct {
	Prefix       string // netns and link names start with it; unique per run, 1 to 6 characters
	Nodes        int    // instances, each with its daemon and Node object
	InstanceType string // default "m5.large"
	MaxPods      int64  // the Node's pod capacity (kubelet max-pods); default 29, EKS's figure for m5.large
	// ADDRetry is how long after a failed CNI ADD the harness tries again
	// (then up to half as long more, at random): kubelet's pod worker
	// backOffPeriod. Default 10 s.
	ADDRetry time.Duration
	BinDir   string // holds vpcipd
	WorkDir  string // per-node state directories are made under it
	// CRDFile and RulesFile are the AddressBudget CRD and the daemon's
	// ClusterRole rules (charts/vpcip/...).
	CRDFile, RulesFile string
	// ChartDir is charts/vpcip: Helm renders its FlowSchema and
	// PriorityLevelConfiguration for the shared EC2 budget's Lease requests
	// (templates/flowcontrol.yaml) for the daemons' ServiceAccount, and the
	// harness applies them; empty: the API server's default flow control.
	ChartDir  string
	DaemonEnv []string // extra KEY=VALUE for every vpcipd
	// RequestLimits are the account's EC2 request buckets; nil: none.
	RequestLimits vpcsim.RequestLimits
	// OperatorQPS and OperatorBurst, when OperatorQPS > 0, put every
	// mutating EC2 request of the fleet through one queue at that rate
	// (vpcsim's Faults.SetCallerQueue): the rate limit of a central
	// operator calling EC2 for all nodes, not its allocation logic.
	OperatorQPS   float64
	OperatorBurst int
	// SharedCPU runs the control plane, the daemons and the harness without
	// CPU groups (cpugroup.go), all threads competing alike: the API server
	// then gets a thread's share among hundreds of daemons'.
	SharedCPU bool
	Logf      func(format string, args ...any) // progress; nil: silent
}

// Fleet is a running fleet.
type Fleet struct {
	Options
	Cloud *vpcsim.Cloud
	Kube  *kubetest.Server
	// Admin is a system:masters client; every request it makes is counted
	// in AdminRequests, so that measurements leave the harness's own out.
	Admin         kubernetes.Interface
	AdminRequests *RequestCounter
	Namespace     string
	Nodes         []*Node

	// apiRetries counts the harness's pod creates the API server timed
	// out or refused for load and the harness repeated.
	apiRetries atomic.Int64

	fab        *fabric.Fabric
	cpu        *cpuGroups // nil: none (SharedCPU, or no cpu controller)
	servers    *fabric.Servers
	kubeconfig string
	forwardEnd chan struct{}
	once       sync.Once
}

// Node is one instance with its daemon.
type Node struct {
	Name       string // Kubernetes node name
	InstanceID string
	PrimaryIP  netip.Addr
	Netns      string
	Dir        string

	fleet  *Fleet
	pid    int // the daemon's last process id, kept after it stopped
	cmd    *exec.Cmd
	done   chan struct{}
	client *api.Client
}

// Socket is the daemon's unix socket.
func (n *Node) Socket() string { return filepath.Join(n.Dir, "ipamd.sock") }

// LogFile holds the daemon's stderr.
func (n *Node) LogFile() string { return filepath.Join(n.Dir, "vpcipd.log") }

// Client is the socket API client of the node's daemon (the plugin's side).
func (n *Node) Client() *api.Client { return n.client }

// PID is the daemon's process id, or 0 when it is not running.
func (n *Node) PID() int {
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Start builds the cloud and its fabric, starts the API server, launches
// the instances and creates their Node objects; daemons start with
// StartDaemons. On error everything made so far is removed.
func Start(ctx context.Context, opts Options) (f *Fleet, err error) {
	if opts.Prefix == "" || len(opts.Prefix) > 6 {
		return nil, fmt.Errorf("fleet prefix %q: want 1 to 6 characters", opts.Prefix)
	}
	if opts.Nodes < 1 {
		return nil, fmt.Errorf("fleet of %d nodes: want at least 1", opts.Nodes)
	}
	if opts.InstanceType == "" {
		opts.InstanceType = "m5.large"
	}
	if opts.MaxPods == 0 {
		opts.MaxPods = 29
	}
	if opts.ADDRetry == 0 {
		opts.ADDRetry = 10 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	f = &Fleet{Options: opts, Namespace: opts.Prefix, forwardEnd: make(chan struct{})}
	defer func() {
		if err != nil {
			f.Close()
			f = nil
		}
	}()
	if f.Cloud, err = vpcsim.New(vpcsim.Config{}); err != nil {
		return f, err
	}
	f.Cloud.Faults().SetRequestLimits(opts.RequestLimits)
	f.Cloud.Faults().SetCallerQueue(opts.OperatorQPS, opts.OperatorBurst)
	if f.fab, err = fabric.New(opts.Prefix); err != nil {
		return f, fmt.Errorf("fabric: %w", err)
	}
	f.Cloud.SetObserver(f.fab)
	if f.servers, err = f.fab.Serve(f.Cloud); err != nil {
		return f, err
	}
	if err := f.startKube(ctx); err != nil {
		return f, err
	}
	if !opts.SharedCPU {
		if f.cpu, err = newCPUGroups(opts.Prefix); err != nil {
			opts.Logf("fleet: control plane, daemons and harness share the CPU alike (%v)", err)
			f.cpu = nil
		}
		for _, pid := range f.Kube.PIDs() {
			if err := f.cpu.add("control-plane", pid); err != nil {
				return f, fmt.Errorf("control plane's CPU group: %w", err)
			}
		}
	}
	start := time.Now()
	subnets := f.Cloud.Subnets()
	for i := range opts.Nodes {
		// Round robin over the VPC's subnets (three /20s by default): a
		// /20 holds 4091 addresses, 67 m5.large nodes at 30 each.
		inst, err := f.Cloud.LaunchInstance(opts.InstanceType, subnets[i%len(subnets)].ID)
		if err != nil {
			return f, fmt.Errorf("launch instance %d: %w", i+1, err)
		}
		n := &Node{
			Name:       fmt.Sprintf("%s-node-%d", opts.Prefix, i+1),
			InstanceID: inst.ID,
			PrimaryIP:  inst.PrimaryENI.PrimaryIP,
			Netns:      f.fab.NodeNetns(inst.ID),
			Dir:        filepath.Join(opts.WorkDir, fmt.Sprintf("node-%d", i+1)),
			fleet:      f,
		}
		n.client = api.NewClient(n.Socket(), 15*time.Second)
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return f, err
		}
		if err := f.createNode(ctx, n.Name); err != nil {
			return f, err
		}
		f.Nodes = append(f.Nodes, n)
	}
	opts.Logf("fleet: %d %s instances and Node objects in %s", opts.Nodes, opts.InstanceType, time.Since(start).Round(time.Millisecond))
	return f, nil
}

// startKube starts etcd and kube-apiserver, installs the AddressBudget CRD
// and the daemon's ServiceAccount, and relays apiAddr inside the fabric to
// the API server.
func (f *Fleet) startKube(ctx context.Context) error {
	var err error
	if f.Kube, err = kubetest.Start(kubetest.Options{Name: "fleet-" + f.Prefix}); err != nil {
		return err
	}
	cfg := *f.Kube.Config
	f.AdminRequests = newRequestCounter()
	cfg.Wrap(f.AdminRequests.wrap)
	if f.Admin, err = kubernetes.NewForConfig(&cfg); err != nil {
		return err
	}
	if err := f.Kube.ApplyFiles(ctx, f.CRDFile); err != nil {
		return err
	}
	if f.ChartDir != "" {
		if err := f.applyFlowControl(ctx); err != nil {
			return err
		}
	}
	sa, err := f.Kube.ServiceAccountConfigFromFile(ctx, "kube-system", "vpcipd", f.RulesFile)
	if err != nil {
		return err
	}
	f.kubeconfig = filepath.Join(f.WorkDir, "vpcipd.kubeconfig")
	if err := kubetest.WriteKubeconfig(kubetest.ConfigVia(sa, apiAddr), f.kubeconfig); err != nil {
		return err
	}
	l, err := f.fab.Listen(apiAddr)
	if err != nil {
		return err
	}
	go func() { f.Kube.Forward(l); close(f.forwardEnd) }()
	return f.Kube.EnsureNamespace(ctx, f.Namespace)
}

// applyFlowControl renders the chart's flow control for the EC2 budget, as
// a release whose ServiceAccount is the daemons' (kube-system/vpcipd) with
// VPCIP_EC2_BUDGET=fleet, with Helm v3, and applies it.
func (f *Fleet) applyFlowControl(ctx context.Context) error {
	helms, err := chart.Helms()
	if err != nil {
		return err
	}
	out, err := helms[0].Run("template", "vpcipd", f.ChartDir, "--namespace", "kube-system", "--set", "fullnameOverride=vpcipd",
		"--set-string", "env.VPCIP_EC2_BUDGET=fleet", "--show-only", "templates/flowcontrol.yaml")
	if err != nil {
		return err
	}
	path := filepath.Join(f.WorkDir, "flowcontrol.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return err
	}
	return f.Kube.ApplyFiles(ctx, path)
}

func (f *Fleet) createNode(ctx context.Context, name string) error {
	node, err := f.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", name, err)
	}
	node.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(f.MaxPods, resource.DecimalSI)}
	node.Status.Allocatable = node.Status.Capacity
	if _, err := f.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("Node %s status: %w", name, err)
	}
	return nil
}

// env is the daemon's environment: production names, the fabric's
// endpoints, per-node paths, no host networking, no listeners but the socket,
// one Go scheduler thread (GOMAXPROCS=1).
func (n *Node) env() []string {
	f := n.fleet
	env := append(fabric.NodeEnv(f.Cloud.Region()),
		"PATH="+os.Getenv("PATH"),
		"VPCIP_SOCKET="+n.Socket(),
		"VPCIP_CHECKPOINT="+filepath.Join(n.Dir, "ipam.json"),
		"VPCIP_CNI_BIN_DIR="+filepath.Join(n.Dir, "bin"),
		"VPCIP_CNI_CONF_DIR="+filepath.Join(n.Dir, "net.d"),
		"VPCIP_PLUGIN_LOG_FILE="+filepath.Join(n.Dir, "plugin.log"),
		"VPCIP_HOSTNET=false",
		"VPCIP_METRICS_ADDR=off",
		"VPCIP_INTROSPECTION_ADDR=off",
		"VPCIP_CLUSTER_NAME="+f.Prefix,
		"MY_NODE_NAME="+n.Name,
		"VPCIP_KUBECONFIG="+f.kubeconfig,
		// One P per daemon: hundreds of Go runtimes on two cores each
		// spinning threads for idle Ps cost CPU the fleet lacks; on EC2 each
		// daemon has its node's cores to itself.
		"GOMAXPROCS=1",
	)
	return append(env, f.DaemonEnv...)
}

// StartDaemons starts every node's vpcipd at once and waits until each is
// ready on its socket, calling ready(node) as each becomes so. It returns
// the first failure after every daemon is ready or has failed.
func (f *Fleet) StartDaemons(ctx context.Context, timeout time.Duration, ready func(*Node)) error {
	for _, n := range f.Nodes {
		if err := n.start(); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(f.Nodes))
	for i, n := range f.Nodes {
		wg.Go(func() {
			if errs[i] = n.waitReady(ctx, timeout); errs[i] == nil && ready != nil {
				ready(n)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (n *Node) start() error {
	logf, err := os.OpenFile(n.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// ip netns exec execs vpcipd in place: the pid is the daemon's.
	cmd := exec.Command("ip", "netns", "exec", n.Netns, filepath.Join(n.fleet.BinDir, "vpcipd"))
	cmd.Env = n.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start vpcipd on %s: %w", n.Name, err)
	}
	n.cmd, n.done, n.pid = cmd, make(chan struct{}), cmd.Process.Pid
	if err := n.fleet.cpu.add("nodes", cmd.Process.Pid); err != nil {
		n.fleet.Logf("fleet: vpcipd on %s stays out of the nodes' CPU group: %v", n.Name, err)
	}
	go func(done chan struct{}) { cmd.Wait(); logf.Close(); close(done) }(n.done)
	return nil
}

func (n *Node) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			return fmt.Errorf("vpcipd on %s exited: %s", n.Name, tail(n.LogFile(), 8))
		default:
		}
		st, err := n.client.Status(ctx)
		if err == nil && st.Ready {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("not ready: %s", st.Reason)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("vpcipd on %s not ready after %s: %v\n%s", n.Name, timeout, last, tail(n.LogFile(), 8))
}

// stop sends SIGTERM and waits up to 20 s for the daemon to exit, then kills it.
func (n *Node) stop() {
	if n.PID() == 0 {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

// Close stops every daemon (all at once), the servers, the API server, and
// removes every netns and link of the fabric. Safe to call more than once
// and on a fleet that failed to start.
func (f *Fleet) Close() error {
	var errs []error
	f.once.Do(func() {
		var wg sync.WaitGroup
		for _, n := range f.Nodes {
			wg.Go(n.stop)
		}
		wg.Wait()
		if f.servers != nil {
			errs = append(errs, f.servers.Close())
		}
		if f.fab != nil {
			errs = append(errs, f.fab.Close()) // closes the relay's listener
			select {
			case <-f.forwardEnd:
			case <-time.After(10 * time.Second):
				errs = append(errs, errors.New("fleet: API server relay still busy after 10 s"))
			}
		}
		errs = append(errs, fabric.Cleanup(f.Prefix))
		if f.Kube != nil {
			f.Kube.Stop()
		}
		errs = append(errs, f.cpu.remove())
	})
	return errors.Join(errs...)
}

// CPUGroups are the process ids in the control plane's CPU group and in
// the daemons' (cpugroup.go); ok is false when the fleet runs without them.
func (f *Fleet) CPUGroups() (controlPlane, nodes []int, ok bool) {
	if f.cpu == nil {
		return nil, nil, false
	}
	return f.cpu.members("control-plane"), f.cpu.members("nodes"), true
}

// Leftovers lists what of the fleet is still on the machine: netns named
// with the prefix, running daemons, and the CPU groups. Empty after a clean
// Close.
func (f *Fleet) Leftovers() []string {
	var out []string
	if f.cpu.exists() {
		out = append(out, "cpu group "+f.cpu.parent)
	}
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		if len(e.Name()) > len(f.Prefix) && e.Name()[:len(f.Prefix)+1] == f.Prefix+"-" {
			out = append(out, "netns "+e.Name())
		}
	}
	for _, n := range f.Nodes {
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", n.pid)); n.pid != 0 && err == nil && strings.TrimSpace(string(comm)) == "vpcipd" {
			out = append(out, fmt.Sprintf("vpcipd pid %d (%s)", n.pid, n.Name))
		}
	}
	return out
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	for i, n := len(s)-1, 0; i >= 0; i-- {
		if s[i] == '\n' {
			if n++; n > lines {
				return s[i+1:]
			}
		}
	}
	return s
}
