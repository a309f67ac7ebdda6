package fabric

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/test/netnsdir"
)

// createNetns creates the named netns /var/run/netns/<name> (netnsdir:
// safe when other processes make their first netns at the same moment). It
// fails if the name exists.
func createNetns(name string) error {
	if _, err := os.Stat(netnsPath(name)); err == nil {
		return fmt.Errorf("netns %s exists (left by a crashed run? remove it with fabric.Cleanup)", name)
	}
	return netnsdir.Create(name)
}

// deleteNetns removes the name of a netns; the kernel frees the netns, and
// the veths in it, once no process or socket uses it. A missing netns is
// success, and a name hidden under stacked /run/netns mounts is removed too.
func deleteNetns(name string) error { return netnsdir.Delete(name) }

// writeSysctls writes /proc/sys/<key> = value for each entry, in the netns of
// the calling thread.
func writeSysctls(kv map[string]string) error {
	for k, v := range kv {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(k, "/", "."), v, err)
		}
	}
	return nil
}

// Cleanup removes what fabrics with this prefix left behind, for instance
// after a crash: it kills every process inside a netns named "<prefix>-*"
// (SIGTERM, then SIGKILL after 2 s) and removes those netns, which takes the
// fabric's veths with them. It also deletes veths in the caller's netns named
// as the fabric names router ends ("<prefix>e" and 8 hex digits,
// "<prefix>out"); the fabric makes none there, but an operator moving one
// while debugging might. It never touches anything else.
func Cleanup(prefix string) error {
	if !prefixRE.MatchString(prefix) {
		return fmt.Errorf("fabric: cleanup: invalid prefix %q", prefix)
	}
	var errs []error
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix+"-") {
			continue
		}
		if err := killNetnsProcesses(netnsPath(e.Name()), 2*time.Second); err != nil {
			errs = append(errs, err)
		}
		if err := deleteNetns(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if _, isVeth := l.(*netlink.Veth); isVeth && isRouterEnd(prefix, l.Attrs().Name) {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fabric: cleanup %s: %w", prefix, err)
	}
	return nil
}

// killNetnsProcesses signals every process (but this one) with a thread in
// the netns bind-mounted at path: SIGTERM, then SIGKILL to those still there
// after grace.
func killNetnsProcesses(path string, grace time.Duration) error {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	pids := netnsProcesses(st.Dev, st.Ino)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for len(pids) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		pids = netnsProcesses(st.Dev, st.Ino)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill %d in %s: %w", pid, path, err)
		}
	}
	return nil
}

// netnsProcesses lists the processes, other than this one, any of whose
// threads is in the netns with this nsfs device and inode.
func netnsProcesses(dev uint64, ino uint64) []int {
	self := os.Getpid()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == self {
			continue
		}
		tasks, _ := filepath.Glob(p + "/task/[0-9]*/ns/net")
		for _, t := range tasks {
			var st syscall.Stat_t
			if syscall.Stat(t, &st) == nil && st.Dev == dev && st.Ino == ino {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// isRouterEnd reports whether name is one the fabric gives a router end.
func isRouterEnd(prefix, name string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	if rest == "out" {
		return true
	}
	hexPart, ok := strings.CutPrefix(rest, "e")
	if !ok || len(hexPart) != 8 {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil
}
