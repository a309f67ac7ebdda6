package ipamd

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/vpcip/vpcip/ipamd/api"
)

// BenchmarkAssignReleaseOverSocket is one ADD and one DEL through the unix
// socket, each answered only after the checkpoint is on disk. "tmpfs" keeps
// the checkpoint on /dev/shm as /var/run is on a node; "disk" on the test's
// temp directory.
func BenchmarkAssignReleaseOverSocket(b *testing.B) {
	for _, where := range []string{"tmpfs", "disk"} {
		b.Run(where, func(b *testing.B) {
			c := startCloud(b)
			n := newNode(b, c, itypeSmall, map[string]string{"IP_COOLDOWN_PERIOD": "0", "WARM_IP_TARGET": "5"})
			if where == "tmpfs" {
				dir, err := os.MkdirTemp("/dev/shm", "vpcipd-bench")
				if err != nil {
					b.Skip("no /dev/shm")
				}
				b.Cleanup(func() { os.RemoveAll(dir) })
				n.env["VPCIP_CHECKPOINT"] = dir + "/ipam.json"
			}
			n.start()
			ctx := context.Background()
			req := api.AssignRequest{Key: key("bench"), Pod: api.Pod{Namespace: "default", Name: "bench"}}
			for b.Loop() {
				if _, err := n.client.Assign(ctx, req); err != nil {
					b.Fatal(err)
				}
				if _, err := n.client.Release(ctx, api.ReleaseRequest{Key: req.Key}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDaemonHeap250 reports the daemon's live heap with 250 pods
// assigned (the whole test process: daemon, provider and the in-process
// vpcsim). cmd/vpcipd's BenchmarkDaemonRSS250 measures the real process.
func BenchmarkDaemonHeap250(b *testing.B) {
	c := startCloud(b)
	n := newNode(b, c, "m5.24xlarge", map[string]string{"WARM_IP_TARGET": "10", "VPCIP_ADD_WAIT": "30s"})
	n.start()
	for i := range 250 {
		if _, err := n.add(fmt.Sprintf("pod-%03d", i)); err != nil {
			b.Fatal(err)
		}
	}
	var ms runtime.MemStats
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms)
	}
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(len(n.d.store.Assignments())), "assignments")
}
