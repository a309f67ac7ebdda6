package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/vpcip/vpcip/test/pluginbuild"
)

// ReferencePluginsVersion is the containernetworking/plugins release the
// tests chain with and measure against.
const ReferencePluginsVersion = "v1.10.0"

var referencePlugins = map[string]string{
	"portmap":    "meta/portmap",
	"bandwidth":  "meta/bandwidth",
	"tuning":     "meta/tuning",
	"ptp":        "main/ptp",
	"bridge":     "main/bridge",
	"loopback":   "main/loopback",
	"host-local": "ipam/host-local",
}

// DefaultPluginDir caches the reference plugins between runs on one machine.
const DefaultPluginDir = "/tmp/vpcip-cni-plugins"

// ReferencePlugins makes sure the named reference CNI plugins are built into
// dir (go install from the Go module proxy; about 25 s cold) and returns dir.
func ReferencePlugins(ctx context.Context, dir string, names ...string) (string, error) {
	if dir == "" {
		dir = DefaultPluginDir
	}
	var missing []string
	for _, n := range names {
		path, ok := referencePlugins[n]
		if !ok {
			return "", fmt.Errorf("unknown reference plugin %q", n)
		}
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			missing = append(missing, "github.com/containernetworking/plugins/plugins/"+path+"@"+ReferencePluginsVersion)
		}
	}
	if len(missing) == 0 {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"install"}, missing...)...)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	cmd.Dir = os.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install reference plugins: %w: %s", err, out)
	}
	return dir, nil
}

// BuildBinaries builds vpcipd, vpcip-cni and vpcipctl into dir as `make
// build` does: stripped, and the plugin, which starts for every pod, as
// package pluginbuild builds it (static, with its build tags).
func BuildBinaries(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags=-s -w", "-o", dir+"/",
		"github.com/vpcip/vpcip/cmd/vpcipd", "github.com/vpcip/vpcip/cmd/vpcipctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	root, err := pluginbuild.Root()
	if err != nil {
		return err
	}
	args, err := pluginbuild.Args(root, dir+"/")
	if err != nil {
		return err
	}
	cmd = exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), pluginbuild.Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build cmd/vpcip-cni: %v\n%s", err, out)
	}
	return nil
}
