package hostnet

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// The daemon re-runs EnsureENI and EnsureSNAT on every reconciliation; these
// measure one re-run on a node that already matches (the common case).

func BenchmarkEnsureENISteady(b *testing.B) {
	benchInNS(b, func(n *testNS) {
		n.addVeth(b, "eth1", "0a:00:00:00:01:01", "eni1peer")
	}, func() error { _, err := EnsureENI(testENI()); return err })
}

func BenchmarkEnsureSNATSteady(b *testing.B) {
	benchInNS(b, func(n *testNS) {
		n.addVeth(b, "eth0", "0a:00:00:00:00:01", "eth0peer")
	}, func() error { return EnsureSNAT(testSNATConfig()) })
}

func benchInNS(b *testing.B, setup func(*testNS), op func() error) {
	needRoot(b)
	n := newNS(b, "bench")
	setup(n)
	err := n.ns.Do(func(ns.NetNS) error {
		if err := op(); err != nil {
			return err
		}
		b.ResetTimer()
		for b.Loop() {
			if err := op(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
