package datapath

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/vpcip/vpcip/test/netnsdir"
)

// BenchmarkSetupTeardown measures the in-process datapath work of one ADD
// (one Session's CreatePair and Configure, as the plugin's ADD) and one DEL (pod interface removal and host
// cleanup), with per-step metrics in ms, in throwaway netns: an IPv4 pod
// on a secondary ENI (rules at 512 and 1536) and an IPv6 pod (no rules, two
// permanent neighbours).
func BenchmarkSetupTeardown(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	b.Run("ipv4", func(b *testing.B) { benchSetupTeardown(b, attachment(2), "vct-dpb4-") })
	b.Run("ipv6", func(b *testing.B) { benchSetupTeardown(b, pod6(0x51, "bench"), "vct-dpb6-") })
}

func benchSetupTeardown(b *testing.B, a Attachment, prefix string) {
	open := func(name string) ns.NetNS {
		_ = netnsdir.Delete(name)
		if err := netnsdir.Create(name); err != nil {
			b.Fatal(err)
		}
		h, err := ns.GetNS(filepath.Join("/var/run/netns", name))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { h.Close(); _ = netnsdir.Delete(name) })
		return h
	}
	node, pod := open(prefix+"node"), open(prefix+"pod")
	var pair, conf, del float64
	err := node.Do(func(ns.NetNS) error {
		b.ResetTimer()
		for range b.N {
			t0 := nowMs()
			s, err := Open(pod)
			if err != nil {
				return err
			}
			if _, err := s.CreatePair(node, a.HostVeth, a.IfName, a.MTU, ""); err != nil {
				s.Close()
				return err
			}
			t1 := nowMs()
			_, err = s.Configure(a)
			s.Close()
			if err != nil {
				return err
			}
			t2 := nowMs()
			if err := Teardown(pod.Path(), "", a); err != nil {
				return err
			}
			pair, conf, del = pair+t1-t0, conf+t2-t1, del+nowMs()-t2
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	b.ReportMetric(pair/n, "pair-ms")
	b.ReportMetric(conf/n, "configure-ms")
	b.ReportMetric(del/n, "teardown-ms")
}

func nowMs() float64 { return float64(time.Now().UnixNano()) / 1e6 }
