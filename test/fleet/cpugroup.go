package fleet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CPU groups model what a real cluster has and this machine lacks: the
// control plane on machines of its own. Without them, 200 daemons starting
// on two cores (one runnable thread each) leave etcd and kube-apiserver a
// share of about 2 in 200 threads, the API server answers the daemons'
// Lease and status requests after seconds, and the fleet measures the
// harness's starved API server rather than the daemons. With them, when
// all three want more than the cores, the control plane gets two thirds
// (controlPlaneWeight) and the daemons together and the harness (vpcsim,
// the API relay, the plugin's side) a sixth each; any of them the rest
// while the others are idle.
//
// cgroup v1's cpu controller (cpu.shares) or cgroup v2's (cpu.weight),
// whichever the machine mounts; neither: the fleet runs without them and
// says so.

// cpuGroupShare is each group's cpu.shares (v1; v2 takes cpu.weight
// shares/1024×100): the weight of two nice-0 threads, as the harness runs
// two Go scheduler threads in the root group.
const cpuGroupShare = 2048

// controlPlaneWeight is the control plane's share in units of
// cpuGroupShare. A real control plane has cores of its own, and the shared
// EC2 budget reads and writes Leases on every mutating request: with equal
// thirds, the 200-node launch's Lease requests took seconds (the AddressBudget
// writes timed out) and the coordinated budget's pods waited on the API
// server, not on EC2 (p99 36–39 s, level with per-node backoff's); at four
// times, 19.9 s against per-node backoff's 38.0 s in the same run, which
// it leaves unchanged (it makes no Lease request).
const controlPlaneWeight = 4

// cpuGroups are one fleet's CPU groups under a parent named for the fleet.
type cpuGroups struct {
	parent string // directory of the fleet's parent group
	v2     bool
}

// cpuGroupRoots are where cgroup v1's cpu hierarchy and cgroup v2 are
// mounted on Debian and most distributions.
var cpuGroupRoots = struct{ v1, v2 string }{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup"}

// newCPUGroups makes "control-plane" and "nodes" under vpcip-fleet-<prefix>.
// It returns an error (and makes nothing) when no cpu controller is mounted
// or writable.
func newCPUGroups(prefix string) (*cpuGroups, error) {
	name := "vpcip-fleet-" + prefix
	if _, err := os.Stat(filepath.Join(cpuGroupRoots.v1, "cpu.shares")); err == nil {
		g := &cpuGroups{parent: filepath.Join(cpuGroupRoots.v1, name)}
		return g, g.make()
	}
	if b, err := os.ReadFile(filepath.Join(cpuGroupRoots.v2, "cgroup.controllers")); err == nil && strings.Contains(" "+string(b)+" ", " cpu") {
		g := &cpuGroups{parent: filepath.Join(cpuGroupRoots.v2, name), v2: true}
		if err := os.WriteFile(filepath.Join(cpuGroupRoots.v2, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
			return nil, fmt.Errorf("cgroup v2: enable cpu: %w", err)
		}
		return g, g.make()
	}
	return nil, errors.New("no cgroup cpu controller mounted")
}

func (g *cpuGroups) make() error {
	if err := os.Mkdir(g.parent, 0o755); err != nil {
		return fmt.Errorf("cpu group: %w", err)
	}
	if g.v2 {
		if err := os.WriteFile(filepath.Join(g.parent, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
			g.remove()
			return fmt.Errorf("cpu group %s: enable cpu: %w", g.parent, err)
		}
	}
	for _, child := range []string{"control-plane", "nodes"} {
		dir := filepath.Join(g.parent, child)
		if err := os.Mkdir(dir, 0o755); err != nil {
			g.remove()
			return fmt.Errorf("cpu group: %w", err)
		}
		share := cpuGroupShare
		if child == "control-plane" {
			share *= controlPlaneWeight
		}
		file, value := "cpu.shares", strconv.Itoa(share)
		if g.v2 {
			file, value = "cpu.weight", strconv.Itoa(share*100/1024)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
			g.remove()
			return fmt.Errorf("cpu group %s: %s: %w", dir, file, err)
		}
	}
	return nil
}

// add moves process pid (all its threads) into group child.
func (g *cpuGroups) add(child string, pid int) error {
	if g == nil {
		return nil
	}
	return os.WriteFile(filepath.Join(g.parent, child, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// remove deletes the groups; processes still in them (none once the fleet
// stopped) go back to the parent's parent first.
func (g *cpuGroups) remove() error {
	if g == nil {
		return nil
	}
	var errs []error
	up := filepath.Dir(g.parent)
	for _, child := range []string{"control-plane", "nodes"} {
		dir := filepath.Join(g.parent, child)
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				_ = os.WriteFile(filepath.Join(up, "cgroup.procs"), []byte(f), 0o644)
			}
		}
		if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(g.parent); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// exists reports whether the fleet's parent group is still on the machine.
func (g *cpuGroups) exists() bool {
	if g == nil {
		return false
	}
	_, err := os.Stat(g.parent)
	return err == nil
}

// members are the process ids in group child.
func (g *cpuGroups) members(child string) []int {
	if g == nil {
		return nil
	}
	b, _ := os.ReadFile(filepath.Join(g.parent, child, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
