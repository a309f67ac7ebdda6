package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// Node is one simulated instance with its daemon.
type Node struct {
	Name       string     // "node-1"
	InstanceID string     // EC2 instance id
	PrimaryIP  netip.Addr // primary ENI's primary address
	Netns      string     // instance netns name
	Dir        string     // state: socket, checkpoint, CNI dirs, logs
	Runtime    *podruntime.Node

	cluster *Cluster
	daemon  *exec.Cmd
	done    chan struct{}
}

func (n *Node) confDir() string  { return filepath.Join(n.Dir, "net.d") }
func (n *Node) binDir() string   { return filepath.Join(n.Dir, "bin") }
func (n *Node) cacheDir() string { return filepath.Join(n.Dir, "cni-cache") }

// Socket is the daemon's unix socket (reachable from any netns: it is a file).
func (n *Node) Socket() string { return filepath.Join(n.Dir, "ipamd.sock") }

// Checkpoint is the daemon's checkpoint file.
func (n *Node) Checkpoint() string { return filepath.Join(n.Dir, "ipam.json") }

// LogFile is where the daemon's stderr goes.
func (n *Node) LogFile() string { return filepath.Join(n.Dir, "vpcipd.log") }

// Env is the daemon's environment: production names, vpcsim endpoints.
func (n *Node) Env() []string {
	c := n.cluster
	env := append(fabric.NodeEnv(c.region()),
		"PATH="+os.Getenv("PATH"),
		"VPCIP_SOCKET="+n.Socket(),
		"VPCIP_CHECKPOINT="+n.Checkpoint(),
		"VPCIP_CNI_BIN_DIR="+n.binDir(),
		"VPCIP_CNI_CONF_DIR="+n.confDir(),
		"VPCIP_PLUGIN_LOG_FILE="+filepath.Join(n.Dir, "plugin.log"),
		"VPCIP_CLUSTER_NAME="+c.Prefix,
	)
	return append(env, c.DaemonEnv...)
}

func (c *Cluster) region() string {
	if c.Sim.Region != "" {
		return c.Sim.Region
	}
	return "us-west-2"
}

// Command returns a command that runs inside the node's netns with the
// daemon's environment.
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Netns, name}, args...)...)
	cmd.Env = n.Env()
	return cmd
}

// Run runs a command in the node's netns and returns its combined output.
func (n *Node) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s on %s: %w: %s", name, strings.Join(args, " "), n.Name, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// StartDaemon starts vpcipd in the node netns and waits until it reports
// ready on its socket.
func (n *Node) StartDaemon(ctx context.Context, extraEnv ...string) error {
	logf, err := os.OpenFile(n.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", n.Netns, filepath.Join(n.cluster.BinDir, "vpcipd"))
	cmd.Env = append(n.Env(), extraEnv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// No Pdeathsig: the kernel sends it when the forking *thread* exits, and
	// Go ends threads that netns code locked, which would kill the daemon at
	// random. Close stops daemons; fabric.Cleanup kills what a crash left.
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start vpcipd on %s: %w", n.Name, err)
	}
	n.daemon, n.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); logf.Close(); close(done) }(n.done)
	return n.WaitReady(ctx, 60*time.Second)
}

// WaitReady polls the daemon's status until it is ready or timeout passes.
func (n *Node) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := n.Client()
	var last error
	for time.Now().Before(deadline) {
		if n.done != nil {
			select {
			case <-n.done:
				return fmt.Errorf("vpcipd on %s exited: %s", n.Name, tail(n.LogFile(), 12))
			default:
			}
		}
		st, err := client.Status(ctx)
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
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("vpcipd on %s not ready after %s: %v\n%s", n.Name, timeout, last, tail(n.LogFile(), 12))
}

// StopDaemon stops the daemon: SIGTERM (graceful) or, with kill, SIGKILL.
func (n *Node) StopDaemon(kill bool) {
	if n.daemon == nil || n.daemon.Process == nil {
		return
	}
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	// ip netns exec execs vpcipd in place, so the pid is the daemon's.
	_ = n.daemon.Process.Signal(sig)
	select {
	case <-n.done:
	case <-time.After(15 * time.Second):
		_ = n.daemon.Process.Kill()
		<-n.done
	}
	n.daemon = nil
}

// InstallCNI runs `vpcipd install-cni` for the node, as a DaemonSet's init step would.
func (n *Node) InstallCNI(ctx context.Context) error {
	cmd := n.Command(ctx, filepath.Join(n.cluster.BinDir, "vpcipd"), "install-cni")
	cmd.Env = append(cmd.Env, "VPCIP_CNI_PLUGIN_SRC="+filepath.Join(n.cluster.BinDir, "vpcip-cni"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vpcipd install-cni on %s: %w: %s", n.Name, err, bytes.TrimSpace(out))
	}
	return nil
}

// Client is an ipamd API client on the node's socket.
func (n *Node) Client() *api.Client { return api.NewClient(n.Socket(), 5*time.Second) }

// Ctl runs vpcipctl in the node netns (the introspection endpoint is on the
// node's own loopback).
func (n *Node) Ctl(ctx context.Context, args ...string) (string, error) {
	return n.Run(ctx, filepath.Join(n.cluster.BinDir, "vpcipctl"), args...)
}

// AddPod starts a pod on the node through the node's conflist.
func (n *Node) AddPod(ctx context.Context, namespace, name string) (*podruntime.Pod, error) {
	return n.Runtime.Add(ctx, podruntime.PodSpec{Namespace: namespace, Name: name})
}

// DelPod stops a pod.
func (n *Node) DelPod(ctx context.Context, p *podruntime.Pod) error { return n.Runtime.Del(ctx, p) }

// PodExec runs a command inside a pod's netns.
func PodExec(ctx context.Context, p *podruntime.Pod, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.Netns, name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in pod %s: %w: %s", name, strings.Join(args, " "), p.Name, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// Ping sends count echo requests from the pod to dst and reports success.
func Ping(ctx context.Context, p *podruntime.Pod, dst netip.Addr) error {
	_, err := PodExec(ctx, p, "ping", "-c", "1", "-W", "2", dst.String())
	return err
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// DaemonPID is the running vpcipd's process id, or 0.
func (n *Node) DaemonPID() int {
	if n.daemon == nil || n.daemon.Process == nil {
		return 0
	}
	return n.daemon.Process.Pid
}

// LogTail returns the last lines of the node's daemon log.
func (n *Node) LogTail(lines int) string { return tail(n.LogFile(), lines) }

// HTTPClient makes its connections from inside the node's netns, where the
// daemon's metrics and introspection endpoints listen.
func (n *Node) HTTPClient() *http.Client {
	// No keep-alive: callers make a client per request, and each would
	// otherwise leave an idle connection open on the daemon's listener
	// (which serves a bounded number at once).
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: fabric.DialContext(n.Netns), DisableKeepAlives: true}}
}
