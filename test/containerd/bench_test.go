package containerd_test

import (
	"context"
	"math"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// benchSandboxes is how many sandboxes one benchmark iteration starts per conflist.
const benchSandboxes = 30

// benchTarget is one conflist on its own node.
type benchTarget struct {
	name string // metric prefix
	node *crinode.Node
	net  podNetwork
}

// BenchmarkRunPodSandbox measures CRI RunPodSandbox wall time as the kubelet
// sees it (netns, CNI ADD chain, pause container start) for benchSandboxes
// sandboxes started one after another with each conflist, on Debian's
// containerd, in the same run. It reports p50 and p99 in milliseconds per
// conflist and, when vpcip runs, the ratio of vpcip's to the reference
// bridge + host-local's. Removal, and waiting for vpcip's warm pool to hold
// benchSandboxes addresses, are not timed.
func BenchmarkRunPodSandbox(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (network namespaces, runc)")
	}
	tools, err := crinode.FindTools("")
	if err != nil {
		b.Skipf("container runtime not set up (%v)", err)
	}
	ctx := context.Background()
	control := startNode(b, tools, newNetns(b), "bridge", "host-local")
	targets := []benchTarget{{name: "bridge", node: control, net: newBridgeNetwork(control, netip.MustParsePrefix("100.127.1.0/24"))}}
	targets = append(targets, vpcipBenchTargets(b, tools)...)
	for _, tg := range targets {
		tg.net.Install(b, tg.node)
		if _, err := tg.node.WaitNetworkReady(ctx, 15*time.Second); err != nil {
			b.Fatal(err)
		}
	}

	times := make(map[string][]time.Duration)
	for b.Loop() {
		for _, tg := range targets {
			if v, ok := tg.net.(vpcipNetwork); ok {
				b.StopTimer()
				v.waitWarm(b, benchSandboxes, time.Minute)
				b.StartTimer()
			}
			ids := make([]string, 0, benchSandboxes)
			for i := range benchSandboxes {
				start := time.Now()
				id, err := tg.node.RunPodSandbox(ctx, podName("bench", i))
				times[tg.name] = append(times[tg.name], time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, id)
			}
			b.StopTimer()
			for _, id := range ids {
				if err := tg.node.RemovePodSandbox(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	}

	b.ReportMetric(0, "ns/op")
	for _, tg := range targets {
		b.ReportMetric(msOf(percentile(times[tg.name], 0.50)), tg.name+"-p50-ms")
		b.ReportMetric(msOf(percentile(times[tg.name], 0.99)), tg.name+"-p99-ms")
	}
	if vp, ok := times["vpcip"]; ok {
		br := times["bridge"]
		b.ReportMetric(float64(percentile(vp, 0.50))/float64(percentile(br, 0.50)), "p50-ratio")
		b.ReportMetric(float64(percentile(vp, 0.99))/float64(percentile(br, 0.99)), "p99-ratio")
	}
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of d.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(rank, 0)]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty is zero", nil, 0.5, 0},
		{"median of odd count", ms(5, 1, 3), 0.5, 3 * time.Millisecond},
		{"p50 of even count is the lower middle (nearest rank)", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p99 of 30 is the largest", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 300), 0.99, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := percentile(tt.in, tt.p); got != tt.want {
			t.Errorf("%s: percentile = %v, want %v", tt.name, got, tt.want)
		}
	}
}
