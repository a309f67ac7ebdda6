package cnitest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Benchmarks of the plugin as the runtime sees it: exec through libcni from
// the node netns of a vpcsim instance running vpcipd with a warm pool.
//
//	go test ./test/cnitest -run '^$' -bench . -benchtime 200x
//
// BenchmarkWarmAddDel alternates, per iteration, one ADD+DEL of vpcip-cni
// alone and one of the reference chain (ptp with host-local IPAM, the same
// MTU, no masquerade) in the same node, each with a fresh sandbox ID in a
// reused pod netns, and reports p50/p99 of each (ms) and our/reference
// ratios (goal: ADD p50 ≤ 0.6, p99 ≤ 0.8). BenchmarkVersion is the exec time
// of `vpcip-cni` VERSION (ns/op).

func percentile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}

// referenceConfList is ptp + host-local, the reference routed-veth chain.
func referenceConfList(dataDir string) []byte {
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "ref", "plugins": []any{
		map[string]any{"type": "ptp", "ipMasq": false, "mtu": 9001, "ipam": map[string]any{
			"type": "host-local", "dataDir": dataDir, "ranges": [][]map[string]string{{{"subnet": "10.99.0.0/16"}}}}},
	}})
	return b
}

type latencies struct{ add, del []time.Duration }

func (l *latencies) once(b *testing.B, e *Env, p *Pod) {
	p.ContainerID = randomHex(32)
	start := time.Now()
	if err := e.Add(b, p); err != nil {
		b.Fatalf("ADD: %v", err)
	}
	mid := time.Now()
	if err := e.Del(b, p); err != nil {
		b.Fatalf("DEL: %v", err)
	}
	l.add = append(l.add, mid.Sub(start))
	l.del = append(l.del, time.Since(mid))
}

func BenchmarkWarmAddDel(b *testing.B) {
	RequireRoot(b)
	b.Run("vpcipd", func(b *testing.B) {
		v := startVPC(b, "m5.4xlarge", 1)
		benchAddDel(b, v.nodes[0], v.daemons[0])
	})
	// The same against the in-process protocol double, which answers from
	// memory: the difference to the vpcipd row is the daemon's own share.
	b.Run("double", func(b *testing.B) {
		benchAddDel(b, NewNode(b), NewFakeDaemon(b, FakePool(16), 9001))
	})
}

func benchAddDel(b *testing.B, node *Node, d Daemon) {
	ours := NewEnv(b, node, d)
	ours.Chain = false
	ref := NewEnv(b, node, d)
	ref.RawConfList = referenceConfList(filepath.Join(b.TempDir(), "host-local"))
	op, rp := ours.NewPod(b, "bench"), ref.NewPod(b, "ref")
	var o, r latencies
	for range 5 { // warm the page cache and both plugins' first-run paths
		o.once(b, ours, op)
		r.once(b, ref, rp)
	}
	o, r = latencies{}, latencies{}
	b.ResetTimer()
	for range b.N {
		o.once(b, ours, op)
		r.once(b, ref, rp)
	}
	b.StopTimer()
	report := func(name string, ours, ref []time.Duration) {
		for _, q := range []struct {
			label string
			v     float64
		}{{"p50", 0.50}, {"p99", 0.99}} {
			ov, rv := percentile(ours, q.v), percentile(ref, q.v)
			b.ReportMetric(ov, name+"-"+q.label+"-ms")
			b.ReportMetric(rv, "ref-"+name+"-"+q.label+"-ms")
			if rv > 0 {
				b.ReportMetric(ov/rv, name+"-"+q.label+"-ratio")
			}
		}
	}
	report("add", o.add, r.add)
	report("del", o.del, r.del)
	AssertNodeClean(b, ours)
	if path := os.Getenv("VCT_BENCH_LOG"); path != "" {
		// The plugin log's assignMs and wireMs split each ADD.
		data, _ := os.ReadFile(ours.LogFile)
		_ = os.WriteFile(path+"."+filepath.Base(b.Name()), data, 0o644)
	}
}

func BenchmarkVersion(b *testing.B) {
	RequireRoot(b)
	bin := BuildPlugin(b)
	ref := filepath.Join(ReferencePlugins(b), "ptp")
	for _, c := range []struct{ name, path string }{{"vpcip-cni", bin}, {"ref-ptp", ref}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				if out, err := execVersion(c.path); err != nil {
					b.Fatalf("VERSION: %v %s", err, out)
				}
			}
		})
	}
}

func execVersion(path string) ([]byte, error) {
	cmd := exec.Command(path)
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
