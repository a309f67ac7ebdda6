// Package crinode runs one containerd, with its CRI plugin and runc, per
// simulated node, and drives it through the Container Runtime Interface
// (k8s.io/cri-api over gRPC), the way the kubelet drives it.
//
// Each Node has its own root, state, socket, runc state and CNI bin and conf
// dirs under one directory, so several run side by side on one machine. A
// Node may run inside a named network namespace (a vpcsim instance): it is
// entered with `nsenter --net` only, not `ip netns exec`, because the latter
// remounts /sys and hides /sys/fs/cgroup from runc. The pod network
// namespaces containerd creates are kept under the Node's state directory.
//
// The package does not import testing; callers close what they start.
package crinode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Config describes one Node.
type Config struct {
	Dir   string // everything the node writes lives under it; keep it short (unix socket paths hold 108 bytes)
	Netns string // named network namespace (/var/run/netns/<Netns>) to run in; "" = the caller's
	// Mountns, when set, is a persistent mount namespace (a file bound by
	// `unshare --mount=<file>`) containerd runs in: a Kubernetes node's own
	// view of host paths such as /opt/cni/bin or /run/vpcip. Dir and the CNI
	// dirs are host paths and must be visible in it.
	Mountns string
	Tools   Tools    // from FindTools
	Plugins []string // reference plugins linked from Tools.PluginDir into the CNI bin dir; loopback is always linked (the CRI plugin brings up lo with it)

	// CNIBinDir and CNIConfDir, when set, are the node's CNI dirs (e.g. where
	// `vpcipd install-cni` writes); by default they are made under Dir.
	CNIBinDir  string
	CNIConfDir string

	// HostNetnsDir puts pod netns in /var/run/netns, where containerd puts
	// them on a real node and where vpcip's DaemonSet looks for them (its
	// witness that a sandbox is gone); the default keeps them under Dir, so
	// nodes sharing the host's mount namespace keep their own. Set it with
	// Mountns, whose private mounts keep the nodes' netns apart.
	HostNetnsDir bool
}

// Node is one running containerd.
type Node struct {
	Config
	Major   int    // containerd major release (1 or 2)
	Socket  string // CRI and containerd API socket
	LogPath string // containerd's stderr

	cmd     *exec.Cmd
	exited  chan struct{}
	started time.Time // when Start began: shim sockets older than this are not this node's
	conn    *grpc.ClientConn
	cri     cri.RuntimeServiceClient
}

// Start writes the node's containerd config, starts containerd, waits until
// CRI answers (up to 30 s) and imports the pause image. It does not wait for
// the CNI network to be ready: that is the caller's conflist to provide.
// On error nothing is left running.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("crinode: Dir %q must be an absolute path", cfg.Dir)
	}
	major, err := ContainerdMajor(ctx, cfg.Tools.Containerd)
	if err != nil {
		return nil, err
	}
	if cfg.CNIBinDir == "" {
		cfg.CNIBinDir = filepath.Join(cfg.Dir, "cni", "bin")
	}
	if cfg.CNIConfDir == "" {
		cfg.CNIConfDir = filepath.Join(cfg.Dir, "cni", "net.d")
	}
	n := &Node{started: time.Now(),
		Config:  cfg,
		Major:   major,
		Socket:  filepath.Join(cfg.Dir, "containerd.sock"),
		LogPath: filepath.Join(cfg.Dir, "containerd.log"),
	}
	if err := n.prepare(); err != nil {
		return nil, err
	}
	if err := n.dial(); err != nil {
		return nil, err
	}
	if err := n.start(ctx); err != nil {
		n.conn.Close()
		return nil, err
	}
	if err := n.importPause(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// prepare makes the directories, links the plugins and writes config.toml.
func (n *Node) prepare() error {
	for _, d := range []string{n.CNIBinDir, n.CNIConfDir, n.path("root"), n.path("state"), n.path("opt")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("crinode: %w", err)
		}
	}
	for _, p := range append([]string{"loopback"}, n.Plugins...) {
		if err := n.LinkPlugin(filepath.Join(n.Tools.PluginDir, p)); err != nil {
			return err
		}
	}
	version := 2
	if n.Major >= 2 {
		version = 3
	}
	pause, err := imageName(n.Tools.PauseArchive)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	err = writeConfig(&buf, configParams{
		Version: version, Root: n.path("root"), State: n.path("state"), Socket: n.Socket,
		RuncRoot: n.path("runc"), OptDir: n.path("opt"), CNIBinDir: n.CNIBinDir, CNIConfDir: n.CNIConfDir,
		Runc: n.Tools.Runc, Pause: pause, HostNetnsDir: n.HostNetnsDir,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(n.path("config.toml"), buf.Bytes(), 0o644)
}

// LinkPlugin puts a symlink to the plugin binary at path into the node's CNI bin dir.
func (n *Node) LinkPlugin(path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("crinode: plugin: %w", err)
	}
	dst := filepath.Join(n.CNIBinDir, filepath.Base(path))
	os.Remove(dst)
	if err := os.Symlink(path, dst); err != nil {
		return fmt.Errorf("crinode: %w", err)
	}
	return nil
}

func (n *Node) path(name string) string { return filepath.Join(n.Dir, name) }

// start launches containerd and waits for CRI to answer.
func (n *Node) start(ctx context.Context) error {
	log, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("crinode: %w", err)
	}
	defer log.Close()
	args := []string{n.Tools.Containerd, "--config", n.path("config.toml")}
	if n.Netns != "" || n.Mountns != "" {
		enter := []string{"nsenter"}
		if n.Netns != "" {
			enter = append(enter, "--net="+filepath.Join("/var/run/netns", n.Netns))
		}
		if n.Mountns != "" {
			enter = append(enter, "--mount="+n.Mountns)
		}
		args = append(append(enter, "--"), args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// containerd finds containerd-shim-runc-v2 on PATH: use the one of its own release.
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(n.Tools.Containerd)+":"+os.Getenv("PATH"))
	// Own process group: a Ctrl-C of the test does not race our orderly stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("crinode: start containerd: %w", err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) { cmd.Wait(); close(exited) }(n.exited)

	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := n.Status(ctx); err == nil {
			return nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			n.stop()
			return fmt.Errorf("crinode: CRI did not answer: %w; log:\n%s", err, n.LogTail(20))
		}
		select {
		case <-n.exited:
			return fmt.Errorf("crinode: containerd exited at start; log:\n%s", n.LogTail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (n *Node) importPause(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, n.Tools.Ctr, "--address", n.Socket, "-n", "k8s.io",
		"images", "import", n.Tools.PauseArchive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("crinode: import %s: %w: %s", n.Tools.PauseArchive, err, out)
	}
	return nil
}

// Running reports whether containerd is running.
func (n *Node) Running() bool {
	if n.exited == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Stop stops containerd (SIGTERM, then SIGKILL after 10 s). Pod sandboxes keep
// running in their shims, as they do when the real daemon restarts.
func (n *Node) Stop() error {
	if !n.Running() {
		return nil
	}
	return n.stop()
}

func (n *Node) stop() error {
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
		return nil
	case <-time.After(10 * time.Second):
		n.cmd.Process.Kill()
		<-n.exited
		return errors.New("crinode: containerd did not stop on SIGTERM within 10 s; killed")
	}
}

// Kill ends containerd with SIGKILL, as a crash would: nothing is flushed and
// the shims keep running their sandboxes. Restart brings it back.
func (n *Node) Kill() error {
	if !n.Running() {
		return nil
	}
	if err := n.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("crinode: kill containerd: %w", err)
	}
	<-n.exited
	return nil
}

// Restart stops containerd and starts it again on the same root and state:
// it recovers the running sandboxes and their cached CNI results.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.Stop(); err != nil {
		return err
	}
	return n.start(ctx)
}

// Close removes every pod sandbox through CRI (best effort), stops
// containerd, kills any shim of this node still running, and unmounts what
// is left under Dir. The returned error joins what failed; the caller
// removes Dir. Closing again only repeats the shim and mount sweep.
func (n *Node) Close() error {
	var errs []error
	if n.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		ids, err := n.PodSandboxIDs(ctx)
		errs = append(errs, err)
		for _, id := range ids {
			errs = append(errs, n.StopPodSandbox(ctx, id), n.RemovePodSandbox(ctx, id))
		}
		cancel()
		errs = append(errs, n.Stop())
	}
	errs = append(errs, n.killShims(), n.deleteContainers(), n.unmountAll())
	removeStaleShimSockets(n.started)
	if n.conn != nil {
		errs = append(errs, n.conn.Close())
		n.conn = nil
	}
	return errors.Join(errs...)
}

// Shims returns the PIDs of the containerd-shim processes serving this
// node's socket, found by their exact "-address <socket>" arguments.
func (n *Node) Shims() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == n.Socket {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// shimSocketDir is where containerd's shims put their sockets (shared by
// every containerd on the machine).
const shimSocketDir = "/run/containerd/s"

// removeStaleShimSockets removes shim sockets made since since that nobody
// listens on any more: shims killed with a crashed node leave them behind.
// A socket a live shim (of any containerd) answers on is kept.
func removeStaleShimSockets(since time.Time) {
	entries, err := os.ReadDir(shimSocketDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || info.Mode()&os.ModeSocket == 0 || info.ModTime().Before(since) {
			continue
		}
		path := filepath.Join(shimSocketDir, e.Name())
		if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
			c.Close()
			continue
		}
		os.Remove(path)
	}
}

// cniResultCache is libcni's default result cache, which containerd uses.
const cniResultCache = "/var/lib/cni/results"

// deleteContainers force-deletes, through runc, every container left in this
// node's runc state (sandboxes whose shim was killed with containerd): runc
// kills their processes and removes their cgroups, so a crashed node leaves
// no pause process behind.
func (n *Node) deleteContainers() error {
	namespaces, err := os.ReadDir(n.path("runc"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range namespaces {
		root := filepath.Join(n.path("runc"), ns.Name())
		ids, err := os.ReadDir(root)
		if err != nil || !ns.IsDir() {
			continue
		}
		for _, id := range ids {
			out, err := exec.Command(n.Tools.Runc, "--root", root, "delete", "--force", id.Name()).CombinedOutput()
			if err != nil && !strings.Contains(string(out), "does not exist") {
				errs = append(errs, fmt.Errorf("runc delete %s: %v: %s", id.Name(), err, bytes.TrimSpace(out)))
			}
			// No CNI DEL ran for it: drop the results libcni cached for it
			// in the host-wide cache (containerd does not make it per node).
			cached, _ := filepath.Glob(filepath.Join(cniResultCache, "*-"+id.Name()+"-*"))
			for _, f := range cached {
				errs = append(errs, os.Remove(f))
			}
		}
	}
	return errors.Join(errs...)
}

// killShims kills the shims of this node that are still running.
func (n *Node) killShims() error {
	pids, err := n.Shims()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return err
}

// Mounts lists the mount points under Dir (sandbox root filesystems, pod
// netns bind mounts), deepest first.
func (n *Node) Mounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], n.Dir+"/") {
			points = append(points, fields[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	return points, sc.Err()
}

// unmountAll lazily unmounts every mount point under Dir, deepest first
// (sandbox root filesystems and pod netns bind mounts of killed shims).
func (n *Node) unmountAll() error {
	points, err := n.Mounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// LogTail returns the last lines of containerd's log.
func (n *Node) LogTail(lines int) string {
	data, _ := os.ReadFile(n.LogPath)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Crash ends the node's runtime as a power loss would: containerd and its
// shims are killed and runc kills every container, so no sandbox keeps a
// process and no CNI DEL runs; containerd's metadata and the CNI result
// cache stay, as they do on disk. Their pod network namespaces stay
// mounted: the caller removes them as a reboot does. Restart brings
// containerd back, which finds the sandboxes dead.
func (n *Node) Crash() error {
	errs := []error{n.Kill(), n.killShims()}
	namespaces, _ := os.ReadDir(n.path("runc"))
	for _, ns := range namespaces {
		root := filepath.Join(n.path("runc"), ns.Name())
		ids, _ := os.ReadDir(root)
		for _, id := range ids {
			out, err := exec.Command(n.Tools.Runc, "--root", root, "delete", "--force", id.Name()).CombinedOutput()
			if err != nil && !strings.Contains(string(out), "does not exist") {
				errs = append(errs, fmt.Errorf("runc delete %s: %v: %s", id.Name(), err, bytes.TrimSpace(out)))
			}
		}
	}
	errs = append(errs, n.unmountAll())
	removeStaleShimSockets(n.started)
	return errors.Join(errs...)
}
