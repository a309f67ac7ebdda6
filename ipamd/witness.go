package ipamd

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vpcip/vpcip/ipamd/datastore"
)

// DefaultNetnsDirs are the directories container runtimes bind-mount pod
// sandboxes' network namespaces in: containerd and CRI-O use
// /var/run/netns (/run/netns through the host's /var/run link). The chart
// mounts both from the host, read-only with host-to-container propagation.
var DefaultNetnsDirs = []string{"/var/run/netns", "/run/netns"}

// netnsWitness is the second witness that a pod is gone: the sandbox's
// netns path recorded at ADD (CNI_NETNS). A host route can vanish while its
// pod lives (an admin, a network manager, a stale DEL); the netns file lives
// exactly as long as the runtime's sandbox. So an address is released
// without a DEL only when its netns path is gone from a directory the
// daemon is known to see, never on the routes' word alone.
//
// A directory counts as seen when it exists in the daemon's mount namespace
// and is either one of dirs (mounted from the host in the chart's DaemonSet;
// the host's own on a host process) or holds the netns of a live, routed
// sandbox. A directory that does not exist (the DaemonSet without the
// mount) or a path recorded in an unseen directory confirms nothing.
type netnsWitness struct {
	dirs []string // DefaultNetnsDirs unless Options.NetnsDirs says otherwise
}

// WitnessState says whether the daemon sees the sandboxes' netns: shown in
// status, introspection, metrics and the AddressBudget condition.
type WitnessState struct {
	// Available: at least one netns directory is seen, so a pod gone
	// without a DEL has its address released after VPCIP_GC_GRACE.
	Available bool
	// Dirs are the directories seen, sorted.
	Dirs []string
	// Reason says why the witness is unavailable ("" when available).
	Reason string
}

// seen is the witness's view for one check: the directories it sees.
func (w netnsWitness) seen(assigned []datastore.Assignment, byAddr map[netip.Addr]string) map[string]bool {
	seen := map[string]bool{}
	for _, d := range w.dirs {
		if isDir(d) {
			seen[filepath.Clean(d)] = true
		}
	}
	for _, a := range assigned {
		if _, routed := byAddr[a.Address]; routed && a.Netns != "" && exists(a.Netns) {
			seen[filepath.Dir(filepath.Clean(a.Netns))] = true
		}
	}
	return seen
}

// state is the WitnessState of a seen set.
func (w netnsWitness) state(seen map[string]bool) WitnessState {
	if len(seen) == 0 {
		return WitnessState{Reason: "no sandbox netns directory is visible (" + strings.Join(w.dirs, ", ") +
			"): mount the host's netns directories into vpcipd; until then no address is released on a missing host route alone"}
	}
	dirs := make([]string, 0, len(seen))
	for d := range seen {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	return WitnessState{Available: true, Dirs: dirs}
}

// gone reports whether a's sandbox is confirmed gone: its recorded netns
// path lies in a seen directory and no longer exists. An assignment rebuilt
// from a host route after a lost checkpoint (Recovered) has no netns path
// but names its host veth, which the kernel destroys with the sandbox's
// netns: its absence (linkExists false, no error) confirms it. Unknown
// paths, unseen directories and failed look-ups confirm nothing.
func (w netnsWitness) gone(a datastore.Assignment, seen map[string]bool, linkExists func(string) (bool, error)) bool {
	if a.Netns == "" {
		if !a.Recovered || a.HostVeth == "" {
			return false
		}
		ok, err := linkExists(a.HostVeth)
		return err == nil && !ok
	}
	p := filepath.Clean(a.Netns)
	return seen[filepath.Dir(p)] && !exists(p)
}

// exists reports whether path exists (a netns file); an error other than
// "does not exist" counts as existing.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil || !errors.Is(err, fs.ErrNotExist)
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
