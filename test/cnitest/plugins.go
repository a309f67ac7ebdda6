// Package cnitest drives vpcip-cni the way a container runtime does: the
// real binary, built from this module, executed through libcni in a conflist
// chained with the reference portmap, bandwidth and tuning plugins, from
// inside a node network namespace, against a daemon speaking ipamd/api. It
// holds the harness (node and pod netns, runtime, leftover assertions), an
// in-process daemon double for plugin-contract tests, and the contract suite
// itself (RunSuite), which runs against any daemon: the double or vpcipd on
// vpcsim.
//
// Every netns it creates is named "vct-..." and removed with t.Cleanup.
// Tests need root and skip without it.
package cnitest

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vpcip/vpcip/test/pluginbuild"
)

// ReferenceVersion is the containernetworking/plugins release the chained
// and benchmark reference plugins come from.
const ReferenceVersion = "v1.10.0"

// ReferencePluginDir caches the reference plugins across test binaries and
// runs so they build once per machine.
const ReferencePluginDir = "/tmp/vpcip-cni-plugins"

// referencePlugins are installed from the Go module proxy.
var referencePlugins = []string{
	"meta/portmap", "meta/bandwidth", "meta/tuning", "main/ptp", "ipam/host-local",
}

// RequireRoot skips t unless it runs as root (netns, netlink, iptables).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// buildDirPrefix names the per-process build dirs; dirs of processes that
// are gone are removed by the next BuildPlugin.
const buildDirPrefix = "/tmp/vct-bin-"

// BuildPlugin builds cmd/vpcip-cni once per test process into
// /tmp/vct-bin-<pid> and returns the binary's path. RemoveBuild (or the next
// process's BuildPlugin) removes it.
func BuildPlugin(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		removeStaleBuilds()
		buildDir = buildDirPrefix + strconv.Itoa(os.Getpid())
		if buildErr = os.MkdirAll(buildDir, 0o755); buildErr != nil {
			return
		}
		// As the Makefile builds it: stripped, static, its build tags.
		root, err := pluginbuild.Root()
		if err != nil {
			buildErr = err
			return
		}
		buildErr = pluginbuild.Build(root, filepath.Join(buildDir, "vpcip-cni"))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "vpcip-cni")
}

// RemoveBuild removes this process's build dir (call it from TestMain).
func RemoveBuild() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

func removeStaleBuilds() {
	dirs, _ := filepath.Glob(buildDirPrefix + "*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(d, buildDirPrefix))
		if err != nil {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, fs.ErrNotExist) {
			_ = os.RemoveAll(d)
		}
	}
}

// ReferencePlugins installs portmap, bandwidth, tuning, ptp and host-local
// at ReferenceVersion into ReferencePluginDir (once per machine, under a
// file lock so parallel test binaries do not race) and returns the dir.
func ReferencePlugins(t testing.TB) string {
	t.Helper()
	dir := ReferencePluginDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, p := range referencePlugins {
		if _, err := os.Stat(filepath.Join(dir, filepath.Base(p))); err != nil {
			missing = append(missing, "github.com/containernetworking/plugins/plugins/"+p+"@"+ReferenceVersion)
		}
	}
	if len(missing) > 0 {
		cmd := exec.Command("go", append([]string{"install"}, missing...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("install reference plugins: %v\n%s", err, out)
		}
	}
	return dir
}

// BinDir returns a CNI bin dir holding vpcip-cni and the reference plugins
// (symlinks), private to t.
func BinDir(t testing.TB) string {
	t.Helper()
	plugin := BuildPlugin(t)
	ref := ReferencePlugins(t)
	dir := t.TempDir()
	if err := os.Symlink(plugin, filepath.Join(dir, "vpcip-cni")); err != nil {
		t.Fatal(err)
	}
	for _, p := range referencePlugins {
		name := filepath.Base(p)
		if err := os.Symlink(filepath.Join(ref, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
