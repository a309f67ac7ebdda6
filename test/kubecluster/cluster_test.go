package kubecluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/chart"
	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/kubetest"
)

// ImageEnv names the vpcip image archive the test installs (make image);
// VpcipctlEnv the vpcipctl binary it runs on the nodes. `make test` sets both.
const (
	ImageEnv    = "VPCIP_IMAGE"
	VpcipctlEnv = "VPCIP_VPCIPCTL"
)

// need skips (or, with VPCIP_REQUIRE_KUBE=1, fails) when something the
// cluster needs is missing.
func need(t *testing.T) (image, vpcipctl string, h chart.Helm) {
	t.Helper()
	skip := func(why string) {
		if os.Getenv(kubetest.RequireEnv) == "1" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		skip("needs root (network and mount namespaces, containerd, kubelet)")
	}
	if why := kubetest.Unavailable(); why != "" {
		skip(why)
	}
	image, vpcipctl = os.Getenv(ImageEnv), os.Getenv(VpcipctlEnv)
	for _, p := range []string{image, vpcipctl} {
		if _, err := os.Stat(p); p == "" || err != nil {
			skip("set " + ImageEnv + " and " + VpcipctlEnv + " (make image builds them)")
		}
	}
	if _, err := crinode.FindTools(crinode.Containerd2Dir()); err != nil {
		skip(err.Error())
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		skip("unshare missing")
	}
	helms, err := chart.Helms()
	if err != nil {
		skip(err.Error())
	}
	return image, vpcipctl, helms[len(helms)-1] // Helm 4 here; the demo installs with Helm 3
}

// TestClusterScenario: the whole walk-through of Scenario in a real cluster,
// with the aws-node style values file installed unchanged.
func TestClusterScenario(t *testing.T) {
	image, vpcipctl, h := need(t)
	values, err := filepath.Abs("../chart/testdata/aws-node-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := WantConfigFromValues(values)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "vk", image)
	s := &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Values: values, Logf: t.Logf, WantConfig: want}
	if err := s.Run(ctx); err != nil {
		for _, n := range c.Nodes {
			t.Logf("kubelet log of %s:\n%s", n.Name, tail(n.KubeletLog(), 30))
		}
		t.Fatal(err)
	}
	// The short chaos campaign on the same cluster (a second cluster would
	// cost its start-up): one fault of each kind, shorter outages and
	// pauses, about 3.5 minutes on a loaded 2-core machine, churn at least BudgetWindow (two of each
	// took 6.5; make chaos runs any number).
	t.Run("ChaosCampaign", func(t *testing.T) {
		if testing.Short() {
			t.Skip("chaos campaign")
		}
		runChaos(t, ctx, &Chaos{PerKind: 1, APIDownMax: 8 * time.Second, EC2Window: 8 * time.Second, Pause: 2 * time.Second},
			&Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Logf: t.Logf})
	})
}

// startCluster starts a two-node cluster with vpcip's image imported, torn
// down when the test ends (nothing may be left). Its netns and link names
// start with letters and this process's ID, so two runs at once do not share
// them.
func startCluster(t *testing.T, ctx context.Context, letters, image string) *Cluster {
	t.Helper()
	return startClusterWith(t, ctx, letters, Options{Image: image})
}

// startClusterWith is startCluster with further options (Prefix and Logf
// are set here).
func startClusterWith(t *testing.T, ctx context.Context, letters string, opts Options) *Cluster {
	t.Helper()
	opts.Prefix = fmt.Sprintf("%s%04x", letters, os.Getpid()&0xffff)
	opts.Logf = t.Logf
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("teardown: %v", err)
		}
		assertNothingLeft(t, c)
	})
	return c
}

// assertNothingLeft checks the cluster removed its directory, its network
// namespaces and its processes.
func assertNothingLeft(t *testing.T, c *Cluster) {
	t.Helper()
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("work directory %s left behind (%v)", c.Dir, err)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, n := range c.Nodes {
		if containsWord(string(out), n.Netns) {
			t.Errorf("netns %s left behind", n.Netns)
		}
	}
	if out, err := exec.Command("pgrep", "-f", c.Dir).Output(); err == nil {
		t.Errorf("processes of %s left running: %s", c.Dir, out)
	}
}

func containsWord(s, w string) bool { return slices.Contains(strings.Fields(s), w) }
