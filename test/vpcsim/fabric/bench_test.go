package fabric

import (
	"net/netip"
	"testing"
)

// BenchmarkAssignUnassign measures what the fabric adds to an
// AssignPrivateIpAddresses + UnassignPrivateIpAddresses pair: one /32 route
// added and removed in the router.
func BenchmarkAssignUnassign(b *testing.B) {
	f := newTestFabric(b)
	f.ENIAttached(instA, testENI(eniA0, 0, primaryA.String(), "02:aa:00:00:00:00"))
	p := []netip.Prefix{netip.PrefixFrom(assigned, 32)}
	for b.Loop() {
		f.AddressesAssigned(eniA0, p)
		f.AddressesUnassigned(eniA0, p)
	}
	if err := f.Err(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAttachDetach measures attaching and detaching a secondary ENI:
// a veth pair made across two netns, configured and deleted.
func BenchmarkAttachDetach(b *testing.B) {
	f := newTestFabric(b)
	f.ENIAttached(instA, testENI(eniA0, 0, primaryA.String(), "02:aa:00:00:00:00"))
	eni := testENI(eniA1, 1, primaryA1.String(), "02:aa:00:00:00:01")
	for b.Loop() {
		f.ENIAttached(instA, eni)
		f.ENIDetached(instA, eniA1)
	}
	if err := f.Err(); err != nil {
		b.Fatal(err)
	}
}
