package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// BenchmarkDaemonRSS250 runs the vpcipd binary against vpcsim, assigns 250
// pod addresses over its socket, and reports the process's resident set
// (VmRSS) in MiB.
func BenchmarkDaemonRSS250(b *testing.B) {
	bin := buildDaemon(b)
	l := vpcsimtest.Start(b, vpcsim.Config{Seed: 9})
	inst := l.Launch(b, "m5.24xlarge")
	dir, err := os.MkdirTemp("", "vpcipd")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	env := append(daemonEnv(l, inst.ID, dir), "VPCIP_ADD_WAIT=30s", "WARM_IP_TARGET=10")
	p := startDaemon(b, bin, env, dir)
	ctx := context.Background()
	for i := range 250 {
		k := fmt.Sprintf("pod-%03d", i)
		if _, err := p.client.Assign(ctx, api.AssignRequest{Key: key(k), Pod: api.Pod{Namespace: "default", Name: k}}); err != nil {
			b.Fatal(err)
		}
	}
	var rss float64
	for b.Loop() {
		rss = vmRSS(b, p.cmd.Process.Pid)
	}
	b.ReportMetric(rss/1024, "RSS-MiB")
}

// vmRSS reads VmRSS (KiB) from /proc/<pid>/status.
func vmRSS(b *testing.B, pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
