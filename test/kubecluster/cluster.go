// Package kubecluster runs a real Kubernetes cluster on vpcsim: etcd and
// kube-apiserver (test/kubetest), kube-controller-manager and kube-scheduler
// on the host's loopback, and on each vpcsim instance a node: its own mount
// namespace (the node's /opt/cni/bin, /etc/cni/net.d, /run/vpcip,
// /var/log/vpcip, /var/log/aws-routed-eni bound from its directory, as a kind node has them), its own
// containerd (test/containerd/crinode) and a kubelet, both in the instance's
// network namespace. vpcip is then installed as users install it: the Helm
// chart, whose DaemonSet the kubelets start from the image `make image`
// builds (imported into each node's containerd; there is no registry).
//
// Nodes reach the API server at https://localhost:6443 on their own
// loopback, a relay listening inside each instance netns: the fabric keeps
// no route to the host, and hostNetwork pods (vpcipd) use the same address
// through KUBERNETES_SERVICE_HOST/PORT, as they would a local API proxy.
//
// The demo (`make demo-cluster`) and the e2e test share it; it does not
// import testing.
package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// Options configure a cluster.
type Options struct {
	Prefix       string // netns and link names start with it; unique per run, at most 6 characters
	Nodes        int    // default 2
	InstanceType string // default "m5.large"
	Image        string // vpcip's OCI archive (make image), imported into every node
	MaxPods      int    // kubelet maxPods; default 110 (above an m5.large's addresses, as on EKS without max-pods tuning)
	// RestartBackOffMax caps kubelet's restart back-off of crashed
	// containers (KubeletConfiguration crashLoopBackOff.maxContainerRestartPeriod,
	// 1 s to 300 s); 0 keeps kubelet's default, 10 s doubling to 5 min, what
	// a user's node does. The chaos campaign sets 1 s so that a
	// vpcipd killed again and again is back in about a second.
	RestartBackOffMax time.Duration
	// Sim is the simulated VPC (subnets, security groups); the zero value
	// gives vpcsim's defaults. Nodes start in its first subnet.
	Sim vpcsim.Config
	// IPv6 makes the cluster IPv6 single-stack, as an EKS IPv6 cluster: the
	// API server listens on and advertises [::1] with an IPv6 Service range
	// (kubetest.ServiceCIDR6), nodes reach it at https://[::1]:6443 (their
	// relay), and each kubelet's node IP is its instance's primary IPv6
	// address (subnets get AssignIPv6OnCreation; the default is one /20 in
	// us-west-2a). The instances keep their primary IPv4 address (EC2 gives
	// every ENI one): IMDS, the EC2 API and pods' IPv4 egress use it. Install
	// vpcip with IPv6Values.
	IPv6 bool
	// DaemonCredentials, when non-nil, replaces the static credentials every
	// install gives the daemons (AWS_ACCESS_KEY_ID=vpcsim, which vpcsim
	// takes while its IAM is off) with these extraEnv entries: an empty
	// list leaves the AWS SDK's default chain to find credentials (a web
	// identity, IMDS's instance profile). May change between installs.
	DaemonCredentials []EnvVar
	Logf              func(format string, args ...any)
}

// EnvVar is one entry of the chart's extraEnv.
type EnvVar struct{ Name, Value string }

// Cluster is a running cluster.
type Cluster struct {
	Options
	Cloud  *vpcsim.Cloud
	Fabric *fabric.Fabric
	API    *kubetest.Server
	Nodes  []*Node
	Dir    string // the cluster's work directory
	Tools  crinode.Tools

	servers   *fabric.Servers
	control   []*exec.Cmd // controller-manager, scheduler
	mntDir    string
	madeDirs  []string // host directories made for the node binds, removed at Close
	closeOnce sync.Once
}

// Start builds the cluster and waits until every node is registered (NotReady
// until a CNI conflist exists: that is the chart's to write). On error
// everything made so far is removed.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.InstanceType == "" {
		opts.InstanceType = "m5.large"
	}
	if opts.MaxPods == 0 {
		opts.MaxPods = 110
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.Prefix == "" || len(opts.Prefix) > 6 {
		return nil, fmt.Errorf("kubecluster: prefix %q: want 1 to 6 characters", opts.Prefix)
	}
	c = &Cluster{Options: opts}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if c.Tools, err = crinode.FindTools(crinode.Containerd2Dir()); err != nil {
		return c, err
	}
	if c.Dir, err = os.MkdirTemp("", "vk-"+opts.Prefix+"-"); err != nil {
		return c, err
	}
	if err := c.startCloud(); err != nil {
		return c, err
	}
	if err := c.startControlPlane(); err != nil {
		return c, err
	}
	if err := c.prepareMounts(ctx); err != nil {
		return c, err
	}
	for range opts.Nodes {
		if _, err := c.startNode(ctx, ""); err != nil {
			return c, err
		}
	}
	return c, c.waitNodesRegistered(ctx, 3*time.Minute)
}

// AddNode launches one more instance in subnetID ("" for the first subnet)
// and starts a node on it, as a node group scaling out does, and waits until
// it is registered. The DaemonSet's pod then starts on it by itself.
func (c *Cluster) AddNode(ctx context.Context, subnetID string) (*Node, error) {
	n, err := c.startNode(ctx, subnetID)
	if err != nil {
		return nil, err
	}
	return n, c.waitNodesRegistered(ctx, 3*time.Minute)
}

func (c *Cluster) startCloud() (err error) {
	if c.IPv6 {
		if len(c.Sim.Subnets) == 0 {
			c.Sim.Subnets = []vpcsim.SubnetSpec{{CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a"}}
		}
		c.Sim.Subnets = slices.Clone(c.Sim.Subnets)
		for i := range c.Sim.Subnets {
			c.Sim.Subnets[i].AssignIPv6OnCreation = true
		}
	}
	if c.Cloud, err = vpcsim.New(c.Sim); err != nil {
		return err
	}
	if c.Fabric, err = fabric.New(c.Prefix); err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	c.Cloud.SetObserver(c.Fabric)
	if c.servers, err = c.Fabric.Serve(c.Cloud); err != nil {
		return fmt.Errorf("serve EC2 API and IMDS in the fabric: %w", err)
	}
	return nil
}

// startControlPlane starts etcd + kube-apiserver, then the controller-manager
// (DaemonSets, ReplicaSets, ServiceAccount tokens' CA ConfigMap, garbage
// collection) and the scheduler, both with the admin credentials and no
// serving port of their own (several clusters may share the machine).
func (c *Cluster) startControlPlane() (err error) {
	c.Logf("starting etcd and kube-apiserver")
	if c.API, err = kubetest.Start(kubetest.Options{Name: "cluster-" + c.Prefix, IPv6: c.IPv6}); err != nil {
		return err
	}
	for _, p := range []struct {
		name string
		args []string
	}{
		{"kube-controller-manager", []string{"--controllers=*", "--use-service-account-credentials=false"}},
		{"kube-scheduler", nil},
	} {
		args := append([]string{"--kubeconfig=" + c.API.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--v=1"}, p.args...)
		cmd, err := c.spawn(p.name, filepath.Join(c.API.BinDir, p.name), args...)
		if err != nil {
			return err
		}
		c.control = append(c.control, cmd)
	}
	return nil
}

func (c *Cluster) spawn(name, path string, args ...string) (*exec.Cmd, error) {
	log, err := os.OpenFile(filepath.Join(c.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go cmd.Wait()
	return cmd, nil
}

// prepareMounts makes the private mount that holds the nodes' mount
// namespace files, and the host directories the nodes bind over (made only
// when missing, removed again at Close).
func (c *Cluster) prepareMounts(ctx context.Context) error {
	c.mntDir = filepath.Join(c.Dir, "mnt")
	if err := os.MkdirAll(c.mntDir, 0o700); err != nil {
		return err
	}
	for _, args := range [][]string{{"--bind", c.mntDir, c.mntDir}, {"--make-private", c.mntDir}} {
		if out, err := exec.CommandContext(ctx, "mount", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("mount %v: %v: %s", args, err, out)
		}
	}
	for _, p := range hostPaths {
		if err := c.mkdirAll(p.at); err != nil {
			return err
		}
	}
	return nil
}

// mkdirAll makes dir and its missing parents, remembering which it made.
func (c *Cluster) mkdirAll(dir string) error {
	var missing []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		c.madeDirs = append(c.madeDirs, missing[i])
	}
	return nil
}

func (c *Cluster) startNode(ctx context.Context, subnetID string) (*Node, error) {
	i := len(c.Nodes)
	inst, err := c.Cloud.LaunchInstance(c.InstanceType, subnetID)
	if err != nil {
		return nil, fmt.Errorf("launch instance %d: %w", i, err)
	}
	n := &Node{
		Name: fmt.Sprintf("node-%d", i+1), InstanceID: inst.ID, PrimaryIP: inst.PrimaryENI.PrimaryIP.String(),
		PrimaryIPv4: inst.PrimaryENI.PrimaryIP.String(),
		Zone:        inst.AvailabilityZone, Region: c.Cloud.Region(),
		Netns: c.Fabric.NodeNetns(inst.ID), Dir: filepath.Join(c.Dir, fmt.Sprintf("n%d", i+1)),
		ipv6: c.IPv6,
	}
	if c.IPv6 {
		if len(inst.PrimaryENI.IPv6Addresses) == 0 {
			return nil, fmt.Errorf("instance %s has no IPv6 address (its subnet assigns none on creation)", inst.ID)
		}
		n.PrimaryIP = inst.PrimaryENI.IPv6Addresses[0].String()
	}
	c.Nodes = append(c.Nodes, n)
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return n, err
	}
	if err := n.makeMountns(ctx, c.mntDir); err != nil {
		return n, err
	}
	if err := n.serveAPI(c.API); err != nil {
		return n, err
	}
	n.CRI, err = crinode.Start(ctx, crinode.Config{
		Dir: n.path("ctd"), Netns: n.Netns, Mountns: n.Mountns, Tools: c.Tools,
		CNIBinDir: n.path("cni-bin"), CNIConfDir: n.path("cni-conf"),
		HostNetnsDir: true, // where the DaemonSet's netns witness looks, as on a real node
	})
	if err != nil {
		return n, fmt.Errorf("containerd of %s: %w", n.Name, err)
	}
	if c.Image != "" {
		if err := n.importImage(ctx, c.Tools.Ctr, c.Image); err != nil {
			return n, err
		}
	}
	if err := n.startKubelet(c.API.BinDir, c.API.Config, c.Options); err != nil {
		return n, err
	}
	c.Logf("%s: instance %s (%s) in %s, primary %s, netns %s, kubelet + containerd %d started", n.Name, inst.ID, c.InstanceType, n.Zone, n.PrimaryIP, n.Netns, n.CRI.Major)
	return n, nil
}

// waitNodesRegistered waits until every node object exists.
func (c *Cluster) waitNodesRegistered(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Kubectl(ctx, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")
		got := strings.Fields(out)
		if err == nil && len(got) == len(c.Nodes) {
			sort.Strings(got)
			c.Logf("nodes registered: %s", strings.Join(got, " "))
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nodes registered: %v (%v); kubelet log of %s:\n%s", got, err, c.Nodes[0].Name, tail(c.Nodes[0].KubeletLog(), 20))
		}
		time.Sleep(time.Second)
	}
}

// Kubectl runs kubectl as the cluster admin.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.API.Kubectl(ctx, args...)
}

// Node finds a node by name.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Close tears everything down: kubelets, every sandbox and containerd, the
// mount namespaces, the control plane, the fabric and the cloud, then the
// work directory and the host directories made for the binds. Safe to call
// more than once.
func (c *Cluster) Close() error {
	var errs []error
	c.closeOnce.Do(func() {
		for _, n := range c.Nodes {
			errs = append(errs, n.close())
		}
		for _, cmd := range c.control {
			cmd.Process.Signal(syscall.SIGTERM)
		}
		if c.API != nil {
			c.API.Stop()
		}
		if c.servers != nil {
			errs = append(errs, c.servers.Close())
		}
		if c.Fabric != nil {
			errs = append(errs, c.Fabric.Close())
		}
		errs = append(errs, fabric.Cleanup(c.Prefix))
		if c.mntDir != "" {
			syscall.Unmount(c.mntDir, syscall.MNT_DETACH)
		}
		if c.Dir != "" {
			errs = append(errs, os.RemoveAll(c.Dir))
		}
		for i := len(c.madeDirs) - 1; i >= 0; i-- {
			os.Remove(c.madeDirs[i]) // only when empty: another user may have put something there since
		}
	})
	return errors.Join(errs...)
}

func tail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func (c *Cluster) kubectlStdin(ctx context.Context, stdin string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.API.BinDir, "kubectl"), append([]string{"--kubeconfig", c.API.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
