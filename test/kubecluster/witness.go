package kubecluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/introspect"
)

// WitnessGrace is the VPCIP_GC_GRACE the cluster's daemons run with
// (clusterValues): how long an address whose host route is gone is kept
// before the daemon asks whether its pod lives.
const WitnessGrace = 10 * time.Second

// WitnessCheck is the VPCIP_RECONCILE_INTERVAL the cluster's daemons run
// with: the host checks run at each reconciliation, and an address is
// released once its route was missing on two in a row past the grace.
const WitnessCheck = 5 * time.Second

// witness checks, in the chart's shape, the daemon's second witness that a
// pod went without a DEL (its sandbox's netns):
//   - every node's daemon sees the sandboxes' netns directory;
//   - a live pod whose host route an admin deleted keeps its address well
//     past the grace (before the DaemonSet mounted the netns directory, it
//     lost it after VPCIP_GC_GRACE and the next pod could get it);
//   - a sandbox whose netns vanished without a DEL (made here by hand
//     through the plugin, as the runtime does, then deleted) has its
//     address released within the grace and two host checks.
func (s *Scenario) witness(ctx context.Context) error {
	for _, n := range s.C.Nodes {
		st, err := s.daemonState(ctx, n)
		if err != nil {
			return err
		}
		if st.SandboxNetns == nil || !st.SandboxNetns.Visible {
			return fmt.Errorf("%s: the daemon does not see the sandboxes' netns: %+v", n.Name, st.SandboxNetns)
		}
		s.Logf("   %s: vpcipd sees sandbox netns in %s", n.Name, strings.Join(st.SandboxNetns.Dirs, ", "))
	}
	n := s.C.Nodes[0]
	pods, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil {
		return err
	}
	var live Pod
	for _, p := range pods {
		if p.Node == n.Name && p.Phase == "Running" && p.IP != "" {
			live = p
			break
		}
	}
	if live.Name == "" {
		return fmt.Errorf("no Running pod on %s", n.Name)
	}
	route, err := n.InNetns(ctx, "ip", "-o", "route", "show", live.IP+"/32")
	if err != nil || !strings.Contains(route, " dev ") {
		return fmt.Errorf("host route of %s (%s): %q %v", live.Name, live.IP, route, err)
	}
	if _, err := n.InNetns(ctx, "ip", "route", "del", live.IP+"/32"); err != nil {
		return err
	}
	// Put the route back at the end, so later steps find the pod wired.
	defer n.InNetns(context.Background(), "ip", append([]string{"route", "replace"}, strings.Fields(route)...)...) //nolint:errcheck

	gone, err := s.vanishingSandbox(ctx, n)
	if err != nil {
		return err
	}
	start := time.Now()
	released := time.Duration(0)
	deadline := start.Add(WitnessGrace + 3*WitnessCheck + 30*time.Second)
	for time.Now().Before(deadline) {
		st, err := s.daemonState(ctx, n)
		if err != nil {
			return err
		}
		holds, other := holderOf(st, live.IP)
		if !holds(live.Name) {
			return fmt.Errorf("%s lost its address %s %s after its host route was deleted; now held by %q",
				live.Name, live.IP, time.Since(start).Round(time.Second), other)
		}
		if released == 0 && !hasKey(st, gone) {
			released = time.Since(start)
		}
		// Done once the vanished sandbox is released and the live pod kept
		// its address for twice the grace (several route-less checks).
		if released > 0 && time.Since(start) > 2*WitnessGrace+5*time.Second {
			s.Logf("   %s kept %s with its host route deleted for %s; a sandbox gone without a DEL was released after %s (grace %s)",
				live.Name, live.IP, time.Since(start).Round(time.Second), released.Round(time.Second), WitnessGrace)
			return nil
		}
		time.Sleep(2 * time.Second)
	}
	if released == 0 {
		return fmt.Errorf("the address of sandbox %s, gone without a DEL, still held %s later", gone, time.Since(start).Round(time.Second))
	}
	return errors.New("timed out")
}

// daemonState is a node's introspection state through vpcipctl.
func (s *Scenario) daemonState(ctx context.Context, n *Node) (introspect.State, error) {
	var st introspect.State
	out, err := n.InNetns(ctx, s.Vpcipctl, "status", "-o", "json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("vpcipctl status on %s: %w: %.200s", n.Name, err, out)
	}
	return st, nil
}

// holderOf returns a test of whether pod name holds addr in st, and who
// holds it ("" when nobody).
func holderOf(st introspect.State, addr string) (func(string) bool, string) {
	for _, a := range st.Assignments {
		if a.Address.String() == addr {
			return func(name string) bool { return a.Pod.Name == name }, a.Pod.Namespace + "/" + a.Pod.Name
		}
	}
	return func(string) bool { return false }, ""
}

func hasKey(st introspect.State, containerID string) bool {
	for _, a := range st.Assignments {
		if a.Key.ContainerID == containerID {
			return true
		}
	}
	return false
}

// vanishingSandbox makes a sandbox on n as a runtime does (a named netns in
// the node's mount namespace, then the installed plugin's ADD with the
// conflist's network config), then deletes the netns without a DEL. It
// returns the sandbox's container ID.
func (s *Scenario) vanishingSandbox(ctx context.Context, n *Node) (string, error) {
	conf, err := pluginConfig(n.path("cni-conf"))
	if err != nil {
		return "", err
	}
	const name, id = "vpcip-witness", "witness-gone-without-del"
	inNode := func(stdin string, env []string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--mount=" + n.Mountns, "--net=" + filepath.Join("/var/run/netns", n.Netns), "--"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				out = append(out, ee.Stderr...)
			}
			return string(out), fmt.Errorf("%s on %s: %v: %s", strings.Join(args, " "), n.Name, err, out)
		}
		return string(out), nil
	}
	if _, err := inNode("", nil, "ip", "netns", "add", name); err != nil {
		return "", err
	}
	env := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + id, "CNI_NETNS=/var/run/netns/" + name,
		"CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin"}
	out, err := inNode(conf, env, "/opt/cni/bin/vpcip-cni")
	if err != nil {
		inNode("", nil, "ip", "netns", "del", name)
		return "", fmt.Errorf("ADD of the hand-made sandbox: %w", err)
	}
	s.Logf("   hand-made sandbox %s on %s: %s", id, n.Name, strings.Join(strings.Fields(out), " "))
	if _, err := inNode("", nil, "ip", "netns", "del", name); err != nil {
		return "", err
	}
	return id, nil
}

// pluginConfig is the network config the runtime gives vpcip-cni: the
// conflist's first plugin with the list's name and CNI version.
func pluginConfig(confDir string) (string, error) {
	files, _ := filepath.Glob(filepath.Join(confDir, "*.conflist"))
	if len(files) == 0 {
		return "", fmt.Errorf("no conflist in %s", confDir)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return "", err
	}
	var list struct {
		CNIVersion string                   `json:"cniVersion"`
		Name       string                   `json:"name"`
		Plugins    []map[string]interface{} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil || len(list.Plugins) == 0 {
		return "", fmt.Errorf("%s: %v", files[0], err)
	}
	p := list.Plugins[0]
	p["cniVersion"], p["name"] = list.CNIVersion, list.Name
	out, err := json.Marshal(p)
	return string(out), err
}
