package cnitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/pluginbuild"
)

// BenchmarkPluginStartVsRevision compares the plugin built from this tree
// with the plugin built from the git revision $VPCIP_BENCH_BASE, as the
// runtime runs it: one process per call, here CNI STATUS, which starts the
// binary, parses the config and makes one call to the daemon (the protocol
// double) through ipamd/api's client. It alternates the two binaries, b.N
// runs each, and reports per run p50 wall time, CPU time (user + system)
// and minor page faults of each, their ratios ours/base, the binaries'
// sizes and, with GNU time installed, each one's peak RSS. With $VPCIP_BENCH_BURST=N it then runs 5 bursts of N
// concurrent STATUS processes of each, alternating, and reports the median
// burst wall time and CPU time per process, as a node starting N pods at
// once would run the plugin. Skipped without $VPCIP_BENCH_BASE:
//
//	VPCIP_BENCH_BASE=main~3 VPCIP_BENCH_BURST=100 go test ./test/cnitest -run '^$' -bench PluginStartVsRevision -benchtime 100x
func BenchmarkPluginStartVsRevision(b *testing.B) {
	rev := os.Getenv("VPCIP_BENCH_BASE")
	if rev == "" {
		b.Skip("set VPCIP_BENCH_BASE to a git revision to compare the plugin with")
	}
	ours, base := BuildPlugin(b), buildPluginAt(b, rev)
	d := NewFakeDaemon(b, FakePool(4), 9001)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "vpcip", "type": "vpcip-cni",
		"ipamdSocket": d.Socket(), "pluginLogFile": "stderr", "pluginLogLevel": "error",
		"timeouts": map[string]string{"status": "60s"}})
	bins := []struct{ name, path string }{{"ours", ours}, {"base", base}}
	for range 3 { // the page cache and both binaries' first runs
		for _, bin := range bins {
			statusRun(b, bin.path, conf)
		}
	}
	runs := map[string][]processRun{}
	b.ResetTimer()
	for range b.N {
		for _, bin := range bins {
			runs[bin.name] = append(runs[bin.name], statusRun(b, bin.path, conf))
		}
	}
	b.StopTimer()
	metrics := []struct {
		name string
		of   func(processRun) float64
	}{
		{"wall-ms", func(r processRun) float64 { return float64(r.wall.Microseconds()) / 1000 }},
		{"cpu-ms", func(r processRun) float64 { return float64(r.cpu.Microseconds()) / 1000 }},
		{"minflt", func(r processRun) float64 { return float64(r.minflt) }},
	}
	for _, m := range metrics {
		o, r := median(runs["ours"], m.of), median(runs["base"], m.of)
		b.ReportMetric(o, "p50-"+m.name)
		b.ReportMetric(r, "base-p50-"+m.name)
		if r > 0 {
			b.ReportMetric(o/r, m.name+"-ratio")
		}
	}
	for _, bin := range bins {
		if st, err := os.Stat(bin.path); err == nil {
			b.ReportMetric(float64(st.Size())/1e6, bin.name+"-binary-MB")
		}
		if rss := peakRSS(b, bin.path, conf); rss > 0 {
			b.ReportMetric(rss, bin.name+"-maxrss-MiB")
		}
	}
	var burst int
	if _, err := fmt.Sscan(os.Getenv("VPCIP_BENCH_BURST"), &burst); err != nil || burst <= 0 {
		return
	}
	walls, cpus := map[string][]float64{}, map[string][]float64{}
	for range 5 {
		for _, bin := range bins {
			w, c := statusBurst(b, bin.path, conf, burst)
			walls[bin.name] = append(walls[bin.name], w)
			cpus[bin.name] = append(cpus[bin.name], c)
		}
	}
	id := func(v float64) float64 { return v }
	ow, bw := median(walls["ours"], id), median(walls["base"], id)
	oc, bc := median(cpus["ours"], id), median(cpus["base"], id)
	b.ReportMetric(ow, "burst-wall-ms")
	b.ReportMetric(bw, "base-burst-wall-ms")
	b.ReportMetric(ow/bw, "burst-wall-ratio")
	b.ReportMetric(oc, "burst-cpu-ms/process")
	b.ReportMetric(bc, "base-burst-cpu-ms/process")
	b.ReportMetric(oc/bc, "burst-cpu-ratio")
}

// processRun is what one plugin process cost, from wait4's rusage. Not
// its peak RSS: Go starts a child with vfork, and the kernel counts the
// parent's resident set, which the child shared until exec, in the child's
// (see peakRSS).
type processRun struct {
	wall, cpu time.Duration
	minflt    int64 // minor page faults
}

// statusRun runs one CNI STATUS of the plugin at path with config conf.
func statusRun(b testing.TB, path string, conf []byte) processRun {
	cmd := exec.Command(path)
	cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=/nonexistent"}
	cmd.Stdin = bytes.NewReader(conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s STATUS: %v: %s", path, err, out.Bytes())
	}
	wall := time.Since(start)
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return processRun{wall: wall, cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), minflt: ru.Minflt}
}

// peakRSS is the median peak resident set (MiB) of 5 STATUS runs of the
// plugin at path, started by GNU time (which forks, so the figure is the
// plugin's own); 0 without /usr/bin/time.
func peakRSS(b testing.TB, path string, conf []byte) float64 {
	if _, err := os.Stat("/usr/bin/time"); err != nil {
		return 0
	}
	var kib []float64
	for range 5 {
		cmd := exec.Command("/usr/bin/time", "-f", "%M", path)
		cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=/nonexistent"}
		cmd.Stdin = bytes.NewReader(conf)
		out, err := cmd.CombinedOutput()
		lines := strings.Fields(string(out))
		var v float64
		if err != nil || len(lines) == 0 {
			b.Fatalf("time %s STATUS: %v: %s", path, err, out)
		}
		if _, err := fmt.Sscan(lines[len(lines)-1], &v); err != nil {
			b.Fatalf("time %s STATUS printed %q", path, out)
		}
		kib = append(kib, v)
	}
	return median(kib, func(v float64) float64 { return v }) / 1024
}

// statusBurst runs n STATUS processes at once and returns the burst's wall
// time and the CPU time per process, in ms.
func statusBurst(b testing.TB, path string, conf []byte, n int) (wallMs, cpuMs float64) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cpu time.Duration
	start := time.Now()
	for range n {
		wg.Go(func() {
			r := statusRun(b, path, conf)
			mu.Lock()
			cpu += r.cpu
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(time.Since(start).Microseconds()) / 1000, float64(cpu.Microseconds()) / 1000 / float64(n)
}

func median[T any](xs []T, of func(T) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = of(x)
	}
	slices.Sort(vs)
	return vs[len(vs)/2]
}

// buildPluginAt builds cmd/vpcip-cni as the Makefile of git revision rev
// of this module's repository does (stripped, static, that revision's
// build tags).
func buildPluginAt(b testing.TB, rev string) string {
	b.Helper()
	root, err := pluginbuild.Root()
	if err != nil {
		b.Fatal(err)
	}
	src := b.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		b.Fatalf("git archive %s: %v: %s", rev, err, out)
	}
	bin := filepath.Join(b.TempDir(), "vpcip-cni")
	if err := pluginbuild.Build(src, bin); err != nil {
		b.Fatalf("revision %s: %v", rev, err)
	}
	return bin
}
