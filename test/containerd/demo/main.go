// Command demo runs vpcip under the real container runtime: a simulated VPC
// with vpcipd on each instance, and on each instance a containerd (CRI
// plugin + runc) whose CNI dirs `vpcipd install-cni` writes to. It shows the
// node turning network-ready only after install-cni, starts pod sandboxes
// through CRI as the kubelet does, sends traffic between sandboxes on two
// nodes, shows each node's capacity, removes the sandboxes and tears
// everything down (also on Ctrl-C).
//
//	go run ./test/containerd/demo --bin bin [--containerd2] [--pods 10]
//
// Needs root and `bash scripts/containerd-setup.sh` (with --containerd2 for
// containerd 2, which is given a cniVersion 1.1.0 conflist; Debian's
// containerd 1.6 gets 1.0.0).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/e2e/cluster"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding vpcipd, vpcip-cni and vpcipctl")
	pods := flag.Int("pods", 10, "pod sandboxes to start, spread over the nodes")
	nodes := flag.Int("nodes", 2, "instances")
	containerd2 := flag.Bool("containerd2", false, "use containerd 2 built by scripts/containerd-setup.sh --containerd2")
	prefix := flag.String("prefix", "vcrd", "name prefix of every netns and link the demo makes")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces, runc)")
		os.Exit(1)
	}
	// cluster.Node.StartDaemon sets Pdeathsig, which fires when the thread
	// that forked vpcipd exits; Go ends threads that a goroutine left locked
	// (the fabric does after creating a netns). Keeping main on its own
	// thread keeps the daemons alive for the whole demo.
	runtime.LockOSThread()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin, *prefix, *nodes, *pods, *containerd2); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

// node is one instance: its daemon and its containerd.
type node struct {
	*cluster.Node
	cri *crinode.Node
}

func run(ctx context.Context, bin, prefix string, nnodes, npods int, containerd2 bool) error {
	dir := ""
	if containerd2 {
		dir = crinode.Containerd2Dir()
	}
	tools, err := crinode.FindTools(dir)
	if err != nil {
		return err
	}
	major, err := crinode.ContainerdMajor(ctx, tools.Containerd)
	if err != nil {
		return err
	}
	binAbs, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "vpcip-crdemo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	cniVersion := crinode.MaxCNIVersion(major)
	step("starting vpcsim: %d × m5.large with vpcipd; conflist cniVersion %s for containerd %d", nnodes, cniVersion, major)
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix: prefix, Nodes: nnodes, BinDir: binAbs, WorkDir: work, PluginDir: tools.PluginDir,
		DaemonEnv: []string{"VPCIP_CNI_VERSION=" + cniVersion},
		Logf:      func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing down")
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "teardown:", err)
		}
	}()
	nodes, err := startRuntimes(ctx, c, tools, work)
	defer func() {
		for _, n := range nodes {
			if err := n.cri.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "containerd teardown:", err)
			}
		}
	}()
	if err != nil {
		return err
	}
	if err := installCNI(ctx, nodes); err != nil {
		return err
	}
	placed, err := startSandboxes(ctx, nodes, npods)
	if err != nil {
		return err
	}
	if len(nodes) > 1 && len(placed) > 1 {
		a, b := placed[0], placed[1]
		step("ping from %s on %s (%s) to %s on %s (%s) across the fabric", a.sb.Pod.Name, a.node.Name, a.sb.IP, b.sb.Pod.Name, b.node.Name, b.sb.IP)
		out, err := exec.CommandContext(ctx, "nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", a.sb.PID),
			"ping", "-c", "2", "-W", "2", b.sb.IP.String()).CombinedOutput()
		fmt.Print(indent(string(out)))
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
	}
	showCapacity(ctx, nodes)
	step("removing every sandbox through CRI (CNI DEL returns the addresses)")
	for _, p := range placed {
		if err := p.node.cri.StopPodSandbox(ctx, p.sb.ID); err != nil {
			return err
		}
		if err := p.node.cri.RemovePodSandbox(ctx, p.sb.ID); err != nil {
			return err
		}
	}
	showCapacity(ctx, nodes)
	return nil
}

// startRuntimes starts a containerd in every node's netns on the CNI dirs
// install-cni writes to, after removing the conflist cluster.Start installed,
// so the demo can show the node before and after install-cni.
func startRuntimes(ctx context.Context, c *cluster.Cluster, tools crinode.Tools, work string) ([]node, error) {
	var out []node
	for _, n := range c.Nodes {
		confDir := filepath.Join(n.Dir, "net.d")
		matches, _ := filepath.Glob(filepath.Join(confDir, "*.conflist"))
		for _, m := range matches {
			os.Remove(m)
		}
		dir, err := os.MkdirTemp(work, "ctrd-")
		if err != nil {
			return out, err
		}
		cn, err := crinode.Start(ctx, crinode.Config{
			Dir: dir, Netns: n.Netns, Tools: tools, CNIBinDir: filepath.Join(n.Dir, "bin"), CNIConfDir: confDir,
		})
		if err != nil {
			return out, err
		}
		out = append(out, node{Node: n, cri: cn})
		st, err := cn.Status(ctx)
		if err != nil {
			return out, err
		}
		step("%s: containerd %d up in netns %s; CRI NetworkReady=%v (%s)", n.Name, cn.Major, n.Netns, st.NetworkReady, st.NetworkMessage)
	}
	return out, nil
}

func installCNI(ctx context.Context, nodes []node) error {
	for _, n := range nodes {
		if err := n.InstallCNI(ctx); err != nil {
			return err
		}
		st, err := n.cri.WaitNetworkReady(ctx, 15*time.Second)
		if err != nil {
			return err
		}
		step("%s: vpcipd install-cni wrote the plugin and 10-vpcip.conflist; CRI NetworkReady=%v", n.Name, st.NetworkReady)
	}
	return nil
}

type placedSandbox struct {
	node node
	sb   crinode.Sandbox
}

// startSandboxes runs npods sandboxes round-robin over the nodes, four at a
// time, and prints where each landed.
func startSandboxes(ctx context.Context, nodes []node, npods int) ([]placedSandbox, error) {
	step("starting %d pod sandboxes through CRI RunPodSandbox", npods)
	out := make([]placedSandbox, npods)
	var g errgroup.Group
	g.SetLimit(4)
	for i := range npods {
		g.Go(func() error {
			n := nodes[i%len(nodes)]
			pod := crinode.Pod{Name: fmt.Sprintf("web-%02d", i+1), Namespace: "default", UID: fmt.Sprintf("uid-web-%02d", i+1)}
			start := time.Now()
			id, err := n.cri.RunPodSandbox(ctx, pod)
			if err != nil {
				return err
			}
			sb, err := n.cri.InspectPodSandbox(ctx, id)
			if err != nil {
				return err
			}
			fmt.Printf("    %s %-7s %-15s sandbox %.12s in %v\n", n.Name, pod.Name, sb.IP, id, time.Since(start).Round(time.Millisecond))
			out[i] = placedSandbox{n, sb}
			return nil
		})
	}
	return out, g.Wait()
}

// showCapacity prints `vpcipctl capacity` of every node (run in its netns,
// where the introspection endpoint listens).
func showCapacity(ctx context.Context, nodes []node) {
	for _, n := range nodes {
		out, err := n.Ctl(ctx, "capacity")
		if err != nil {
			out = err.Error()
		}
		fmt.Printf("--- %s (vpcipctl capacity)\n%s", n.Name, indent(out))
	}
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
