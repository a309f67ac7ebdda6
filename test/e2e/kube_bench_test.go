package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// BenchmarkKubeRSS measures vpcipd's resident memory with 250 pods on a
// c5.18xlarge, once with the Kubernetes part on (node-1: watching its 250
// pods and its Node, publishing its AddressBudget) and once off (node-2, the
// same pods without a node name), in the same run. It reports both in MiB;
// the goal is at most 40 MiB with the part on.
//
//	go test -run '^$' -bench KubeRSS -benchtime 1x ./test/e2e
func BenchmarkKubeRSS(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	if why := kubetest.Unavailable(); why != "" {
		b.Skip(why)
	}
	for range b.N {
		on, off := measureKubeRSS(b, 250)
		b.ReportMetric(on, "MiB-rss-kube-on")
		b.ReportMetric(off, "MiB-rss-kube-off")
	}
}

func measureKubeRSS(b *testing.B, pods int) (on, off float64) {
	b.Helper()
	bin, err := os.MkdirTemp("", "vpcip-rss-bin-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(bin)
	if err := cluster.BuildBinaries(context.Background(), bin); err != nil {
		b.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer scancel()
	c, err := cluster.Start(sctx, cluster.Options{Nodes: 2, InstanceType: "c5.18xlarge", DaemonEnv: []string{"WARM_IP_TARGET=32"},
		Prefix: fmt.Sprintf("eb%d", os.Getpid()%1000), BinDir: bin, WorkDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	k, err := kubetest.Start(kubetest.Options{Name: "rss"})
	if err != nil {
		b.Fatal(err)
	}
	defer k.Stop()
	e := joinKube(b, k, c, 250, nil, c.Nodes[0])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*pods)
	sem := make(chan struct{}, 8)
	for i := range pods {
		p := e.bind(b, c.Nodes[0], fmt.Sprintf("rss-%d", i))
		for _, n := range c.Nodes {
			wg.Add(1)
			go func(n *cluster.Node, p *corev1.Pod) {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				if _, err := n.Runtime.Add(ctx, podruntime.PodSpec{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}); err != nil {
					errs <- err
				}
			}(n, p)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	time.Sleep(20 * time.Second) // the AddressBudget written, caches settled
	return float64(vmRSS(c.Nodes[0].DaemonPID())) / 1024, float64(vmRSS(c.Nodes[1].DaemonPID())) / 1024
}

// vmRSS reads VmRSS of pid, in KiB.
func vmRSS(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return n
		}
	}
	return 0
}
