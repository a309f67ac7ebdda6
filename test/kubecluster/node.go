package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/kubetest"
)

// hostPaths are the host directories a node sees as its own: each is bound
// from the node's directory in the node's mount namespace, as a kind node
// container has them on its own file system. /var/run/vpcip is /run/vpcip
// through the host's /var/run -> /run link, so binding /run/vpcip covers both.
var hostPaths = []struct{ dir, at string }{
	{"cni-bin", "/opt/cni/bin"},
	{"cni-conf", "/etc/cni/net.d"},
	{"run-vpcip", "/run/vpcip"},
	{"log-vpcip", "/var/log/vpcip"},
	{"log-aws-routed-eni", "/var/log/aws-routed-eni"}, // AWS_VPC_K8S_CNI_LOG_FILE, AWS_VPC_K8S_PLUGIN_LOG_FILE
	// The CNI state of a node: libcni's result cache and host-local's
	// stores (the plugin's IPv4 egress store is /var/lib/cni/vpcip-egress4).
	// Shared with the host, another test's leftover egress store there
	// made every DEL on these IPv4 nodes call host-local, which they do not
	// install, and fail: pods stuck Terminating for good.
	{"var-lib-cni", "/var/lib/cni"},
}

// apiPort is where each node reaches the API server on its own loopback: a
// relay listening inside the node's network namespace, so kubelet and
// hostNetwork pods reach the API without any route out of the fabric.
const apiPort = 6443

// Node is one Kubernetes node on a vpcsim instance: a network namespace (the
// instance), a mount namespace, a containerd and a kubelet.
type Node struct {
	Name       string // Kubernetes node name, e.g. "node-1"
	InstanceID string
	PrimaryIP  string // the kubelet's node IP: the primary IPv4 address, or the primary IPv6 one in an IPv6 cluster
	// PrimaryIPv4 is the instance's primary IPv4 address (an IPv6 cluster's
	// nodes have one too: pods' IPv4 egress leaves with it).
	PrimaryIPv4 string
	Zone        string // the instance's availability zone, e.g. "us-west-2a"
	Region      string // e.g. "us-west-2"
	Netns       string // the instance's named network namespace
	Mountns     string // file holding the node's mount namespace
	Dir         string // everything the node writes, on the host
	CRI         *crinode.Node

	ipv6        bool // Options.IPv6: the API relay listens on [::1]
	kubelet     *exec.Cmd
	kubeletDone chan struct{}
	api         net.Listener
	// sandboxNetns: the netns files of the sandboxes seen at teardown,
	// removed once the runtime is gone (removeSandboxNetnsFiles).
	sandboxNetns []string
}

func (n *Node) path(elem ...string) string { return filepath.Join(append([]string{n.Dir}, elem...)...) }

// KubeletLog is the kubelet's log file.
func (n *Node) KubeletLog() string { return n.path("kubelet.log") }

// makeMountns creates the node's persistent mount namespace and binds its
// host paths in it. mntDir must be a private mount (see Cluster.prepareMounts).
func (n *Node) makeMountns(ctx context.Context, mntDir string) error {
	n.Mountns = filepath.Join(mntDir, n.Name)
	if err := os.WriteFile(n.Mountns, nil, 0o600); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "unshare", "--mount="+n.Mountns, "--propagation", "private", "true").CombinedOutput(); err != nil {
		return fmt.Errorf("mount namespace of %s: %v: %s", n.Name, err, out)
	}
	var script []string
	for _, p := range hostPaths {
		src := n.path(p.dir)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		script = append(script, fmt.Sprintf("mkdir -p %s && mount --bind %s %s", p.at, src, p.at))
	}
	// /run/netns, where the node's containerd mounts pod netns, is a shared
	// mount as on a systemd host (and as `ip netns` leaves it): the
	// DaemonSet mounts it with host-to-container propagation, which the
	// runtime refuses on a private mount.
	script = append(script, "mkdir -p /run/netns",
		"mountpoint -q /run/netns || mount --bind /run/netns /run/netns", "mount --make-shared /run/netns")
	out, err := exec.CommandContext(ctx, "nsenter", "--mount="+n.Mountns, "--", "sh", "-ec", strings.Join(script, "\n")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("bind host paths of %s: %v: %s", n.Name, err, out)
	}
	return nil
}

// apiHost is where the node reaches the API server: its relay on its own
// loopback, [::1] in an IPv6 cluster.
func (n *Node) apiHost() string {
	if n.ipv6 {
		return "::1"
	}
	return "127.0.0.1"
}

func (n *Node) apiHostPort() string { return net.JoinHostPort(n.apiHost(), strconv.Itoa(apiPort)) }

// serveAPI starts the API relay on the node's loopback.
func (n *Node) serveAPI(api *kubetest.Server) error {
	netns, err := ns.GetNS(filepath.Join("/var/run/netns", n.Netns))
	if err != nil {
		return err
	}
	defer netns.Close()
	err = netns.Do(func(ns.NetNS) error {
		var lerr error
		n.api, lerr = net.Listen("tcp", n.apiHostPort())
		return lerr
	})
	if err != nil {
		return fmt.Errorf("API relay in %s: %w", n.Netns, err)
	}
	go api.Forward(n.api)
	return nil
}

// kubeletConfig is the node's KubeletConfiguration. cgroupsPerQOS off and
// failCgroupV1 off: these VMs run cgroup v1 without a systemd; oomScoreAdj 0:
// they lack CAP_SYS_RESOURCE; eviction and image GC thresholds out of reach so
// a full test disk never evicts the scenario's pods; logs and state under the
// node's directory. Options.RestartBackOffMax appends crashLoopBackOff.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: ["none"]
cgroupDriver: cgroupfs
oomScoreAdj: 0
failSwapOn: false
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
podLogsDir: %s
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
maxPods: %d
resolvConf: /etc/resolv.conf
registerNode: true
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
`

// startKubelet writes the kubelet's config and kubeconfig and starts it in
// the node's network and mount namespaces.
func (n *Node) startKubelet(binDir string, admin *rest.Config, opts Options) error {
	for _, d := range []string{n.path("kubelet"), n.path("pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	cfg := fmt.Sprintf(kubeletConfig, n.CRI.Socket, n.path("pod-logs"), opts.MaxPods)
	if opts.RestartBackOffMax > 0 {
		// KEP-5593, gate KubeletCrashLoopBackOffMax (beta, on by default since
		// 1.35): the first restart delay is also capped by it.
		cfg += fmt.Sprintf("crashLoopBackOff: {maxContainerRestartPeriod: %s}\n", opts.RestartBackOffMax)
	}
	if err := os.WriteFile(n.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	via := rest.CopyConfig(admin)
	via.Host = fmt.Sprintf("https://localhost:%d", apiPort)
	if n.ipv6 {
		via.Host = "https://" + n.apiHostPort()
	}
	if err := kubetest.WriteKubeconfig(via, n.path("kubelet.kubeconfig")); err != nil {
		return err
	}
	log, err := os.OpenFile(n.KubeletLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command("nsenter", "--net="+filepath.Join("/var/run/netns", n.Netns), "--mount="+n.Mountns, "--",
		filepath.Join(binDir, "kubelet"),
		"--config="+n.path("kubelet.yaml"), "--kubeconfig="+n.path("kubelet.kubeconfig"),
		"--hostname-override="+n.Name, "--node-ip="+n.PrimaryIP,
		// The well-known topology labels an EKS node carries from its
		// instance (ENI_CONFIG_LABEL_DEF=topology.kubernetes.io/zone
		// chooses the ENIConfig by it).
		"--node-labels=topology.kubernetes.io/zone="+n.Zone+",topology.kubernetes.io/region="+n.Region,
		"--root-dir="+n.path("kubelet"), "--cert-dir="+n.path("kubelet", "pki"), "--v=1")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a Ctrl-C reaches us, not it: we stop it in order
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kubelet of %s: %w", n.Name, err)
	}
	n.kubelet, n.kubeletDone = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(n.kubeletDone)
	return nil
}

// stopKubelet stops the kubelet (SIGTERM, SIGKILL after 10 s). Its pods keep
// running in containerd, as on a real node.
func (n *Node) stopKubelet() {
	if n.kubelet == nil {
		return
	}
	n.kubelet.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.kubeletDone:
	case <-time.After(10 * time.Second):
		n.kubelet.Process.Kill()
		<-n.kubeletDone
	}
	n.kubelet = nil
}

// importImage loads an OCI archive into the node's containerd (namespace k8s.io).
func (n *Node) importImage(ctx context.Context, ctr, archive string) error {
	out, err := exec.CommandContext(ctx, ctr, "--address", n.CRI.Socket, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import %s into %s: %v: %s", archive, n.Name, err, out)
	}
	return nil
}

// InNetns runs a command in the node's network namespace (vpcipctl reads
// the daemon's introspection endpoint on the node's loopback).
func (n *Node) InNetns(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + filepath.Join("/var/run/netns", n.Netns), "--", name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s on %s: %v: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// removePodNetworkSandboxes removes the workload's sandboxes while the
// node's vpcipd still runs, so their CNI
// DELs release the addresses; a teardown after Ctrl-C then leaves nothing for
// DEL retries. Best effort: crinode.Close sweeps whatever remains, vpcipd's
// sandbox among them, so the bound is generous: 34 pods on a loaded machine
// did not all stop within a minute, and the rest then failed their DELs
// against a daemon already stopped.
func (n *Node) removePodNetworkSandboxes() {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ids, err := n.CRI.PodSandboxIDs(ctx)
	if err != nil {
		return
	}
	for _, id := range ids {
		sb, err := n.CRI.InspectPodSandbox(ctx, id)
		if err != nil {
			continue
		}
		if sb.NetnsPath != "" {
			n.sandboxNetns = append(n.sandboxNetns, sb.NetnsPath)
		}
		// Not kube-system's: vpcipd runs there (its host-network sandbox may
		// report the node's address as its own).
		if sb.Pod.Namespace != "kube-system" {
			n.CRI.StopPodSandbox(ctx, id)
			n.CRI.RemovePodSandbox(ctx, id)
		}
	}
}

// removeSandboxNetnsFiles unmounts and removes the netns files of the
// sandboxes removePodNetworkSandboxes saw, once the runtime is gone: a
// sandbox whose stop failed (its CNI DEL refused, say, in a failed test)
// keeps its /run/netns/cni-* file, which is the host's directory, and the
// node's mount namespace going away leaves the file behind empty.
func (n *Node) removeSandboxNetnsFiles() error {
	var errs []error
	for _, p := range n.sandboxNetns {
		syscall.Unmount(p, syscall.MNT_DETACH) // EINVAL when not mounted here
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("netns file of a sandbox of %s: %w", n.Name, err))
		}
	}
	n.sandboxNetns = nil
	return errors.Join(errs...)
}

// close stops the kubelet, removes every sandbox and stops containerd, closes
// the API relay and drops the mount namespace.
func (n *Node) close() error {
	n.stopKubelet()
	var err error
	if n.CRI != nil {
		n.removePodNetworkSandboxes()
		err = n.CRI.Close()
	}
	if n.api != nil {
		n.api.Close()
	}
	if n.Mountns != "" {
		syscall.Unmount(n.Mountns, syscall.MNT_DETACH)
	}
	return errors.Join(err, n.removeSandboxNetnsFiles())
}

// RestartKubelet stops n's kubelet (SIGTERM) and starts it again with the
// same configuration; its pods keep running in containerd meanwhile.
func (c *Cluster) RestartKubelet(n *Node) error {
	n.stopKubelet()
	return n.startKubelet(c.API.BinDir, c.API.Config, c.Options)
}

// Reboot power-cycles node n as far as a node's software sees it: kubelet
// and the runtime die at once (every container with them, no CNI DEL), the
// pods' network namespaces are gone (and with them their veths and host
// routes) and so are the pod policy rules, /run/vpcip is emptied unless
// keepCheckpoint (a checkpoint on a persistent hostPath), then containerd
// and kubelet start again, which restart the DaemonSet's pod and recreate
// the node's pods in new sandboxes. The instance's ENIs and their EC2
// addresses stay, as they do across a reboot.
func (c *Cluster) Reboot(ctx context.Context, n *Node, keepCheckpoint bool) error {
	if n.kubelet != nil {
		n.kubelet.Process.Kill()
		<-n.kubeletDone
		n.kubelet = nil
	}
	if err := n.CRI.Crash(); err != nil {
		return fmt.Errorf("crash the runtime of %s: %w", n.Name, err)
	}
	// Only this node's: the directory is shared with the other nodes, and
	// unlinking a file another mount namespace mounts a netns on detaches it there.
	// What a reboot empties in the node's netns: every policy rule but the
	// kernel's three, every route table but main and local, the secondary
	// ENIs' configuration (links down, addresses gone: the ENIs stay
	// attached, and an OS that configures only eth0 brings them back bare),
	// and every iptables table of both backends.
	script := `for f in /run/netns/cni-*; do mountpoint -q "$f" || continue; umount "$f" && rm -f "$f"; done
for p in $(ip -4 rule show | sed 's/:.*//' | sort -un); do
	case $p in 0|32766|32767) ;; *) while ip -4 rule del pref $p 2>/dev/null; do :; done;; esac
done
for t in $(ip -4 route show table all | sed -n 's/.* table \([^ ]*\).*/\1/p' | sort -u); do
	case $t in main|local) ;; *) ip -4 route flush table $t;; esac
done
for l in $(ip -o link show | sed -n 's/^[0-9]*: \(eth[1-9][0-9]*\)[@:].*/\1/p'); do
	ip link set dev $l down && ip addr flush dev $l
done
for ipt in iptables iptables-legacy; do
	command -v $ipt >/dev/null || continue
	for t in filter nat mangle raw; do $ipt -w -t $t -F && $ipt -w -t $t -X; done
done`
	out, err := exec.CommandContext(ctx, "nsenter", "--mount="+n.Mountns, "--net="+filepath.Join("/var/run/netns", n.Netns), "--", "sh", "-c", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("reboot %s: pod netns and rules: %v: %s", n.Name, err, out)
	}
	run := n.path("run-vpcip")
	entries, err := os.ReadDir(run)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if keepCheckpoint && e.Name() == filepath.Base(config.DefaultCheckpoint) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(run, e.Name())); err != nil {
			return err
		}
	}
	if err := n.CRI.Restart(ctx); err != nil {
		return fmt.Errorf("reboot %s: containerd: %w", n.Name, err)
	}
	return n.startKubelet(c.API.BinDir, c.API.Config, c.Options)
}
