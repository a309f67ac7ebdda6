// Package e2e runs vpcip end to end on vpcsim: real vpcipd processes inside
// instance netns reaching vpcsim's EC2 API and IMDS through the fabric, the
// real vpcip-cni driven through libcni by podruntime, and packets through the
// fabric. Every test builds its own cluster with a unique prefix and removes
// it, also on failure.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	prefixN   atomic.Int32
)

// binaries builds vpcipd, vpcip-cni and vpcipctl once per test run.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "vpcip-e2e-bin-")
		if buildErr != nil {
			return
		}
		buildErr = cluster.BuildBinaries(context.Background(), binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end tests need root: they build network namespaces")
	}
	for _, tool := range []string{"ip", "iptables", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// start builds a cluster for one test and removes it when the test ends.
func start(t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	requireRoot(t)
	opts.BinDir = binaries(t)
	if opts.Prefix == "" {
		opts.Prefix = fmt.Sprintf("ve%d%d", os.Getpid()%100, prefixN.Add(1))
	}
	opts.WorkDir = t.TempDir()
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				b, _ := os.ReadFile(n.LogFile())
				t.Logf("%s vpcipd log (tail):\n%s", n.Name, lastLines(string(b), 30))
				b, _ = os.ReadFile(filepath.Join(n.Dir, "plugin.log"))
				t.Logf("%s plugin log (tail):\n%s", n.Name, lastLines(string(b), 15))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
		assertNothingLeft(t, opts.Prefix)
	})
	return c
}

// assertNothingLeft checks that no netns or host link with the prefix remains.
func assertNothingLeft(t *testing.T, prefix string) {
	t.Helper()
	entries, _ := os.ReadDir(podruntime.NetnsDir)
	for _, e := range entries {
		if len(e.Name()) >= len(prefix) && e.Name()[:len(prefix)] == prefix {
			t.Errorf("netns %s left behind", e.Name())
		}
	}
	out, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range splitLines(string(out)) {
		if containsWord(line, prefix) {
			t.Errorf("host link left behind: %s", line)
		}
	}
}

// addPods starts n pods on node, retrying each ADD the way kubelet retries a
// sandbox that failed, until deadline.
func addPods(t *testing.T, ctx context.Context, node *cluster.Node, n int, name string, parallel int) []*podruntime.Pod {
	t.Helper()
	pods := make([]*podruntime.Pod, n)
	errs := make([]error, n)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pods[i], errs[i] = addWithRetry(ctx, node, fmt.Sprintf("%s-%d", name, i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod %s-%d on %s: %v", name, i, node.Name, err)
		}
	}
	return pods
}

func addWithRetry(ctx context.Context, node *cluster.Node, name string) (*podruntime.Pod, error) {
	var err error
	for ctx.Err() == nil {
		var p *podruntime.Pod
		if p, err = node.AddPod(ctx, "default", name); err == nil {
			return p, nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("gave up: %w", err)
}

// eniOf returns the cloud's view of which ENI (and device index) holds addr.
func eniOf(cloud *vpcsim.Cloud, addr netip.Addr) (vpcsim.ENIInfo, bool) {
	for _, e := range cloud.NetworkInterfaces() {
		for _, a := range e.SecondaryIPs {
			if a == addr {
				return e, true
			}
		}
		for _, p := range e.Prefixes {
			if p.Contains(addr) {
				return e, true
			}
		}
	}
	return vpcsim.ENIInfo{}, false
}

// assertPodsOwned checks that pod addresses are unique and each is assigned
// in the cloud to an ENI of the node's own instance.
func assertPodsOwned(t *testing.T, c *cluster.Cluster, node *cluster.Node, pods []*podruntime.Pod, seen map[netip.Addr]string) {
	t.Helper()
	for _, p := range pods {
		if !p.Address.IsValid() {
			t.Errorf("pod %s has no IPv4 address in its result", p.Name)
			continue
		}
		if other, dup := seen[p.Address]; dup {
			t.Errorf("address %s given to %s and %s", p.Address, p.Name, other)
		}
		seen[p.Address] = p.Name
		e, ok := eniOf(c.Cloud, p.Address)
		if !ok {
			t.Errorf("pod %s address %s is not assigned to any ENI in the cloud", p.Name, p.Address)
		} else if e.InstanceID != node.InstanceID {
			t.Errorf("pod %s address %s is on %s of %s, not of its node %s", p.Name, p.Address, e.ID, e.InstanceID, node.InstanceID)
		}
	}
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func containsWord(line, prefix string) bool {
	for i := 0; i+len(prefix) <= len(line); i++ {
		if line[i:i+len(prefix)] == prefix && (i == 0 || line[i-1] == ' ' || line[i-1] == '@') {
			return true
		}
	}
	return false
}

func lastLines(s string, n int) string {
	l := splitLines(s)
	if len(l) > n {
		l = l[len(l)-n:]
	}
	out := ""
	for _, x := range l {
		out += x + "\n"
	}
	return out
}
