package awsprovider

import (
	"testing"

	"github.com/vpcip/vpcip/provider"
)

// BenchmarkMetadataENIs measures one IMDS listing of an instance with four
// ENIs, and reports the IMDS GETs it takes.
func BenchmarkMetadataENIs(b *testing.B) {
	s := startSim(b)
	c := s.client(b, testOptions(), "")
	for range 3 {
		if _, err := c.CreateENI(b.Context(), provider.CreateENIRequest{Addresses: 5}); err != nil {
			b.Fatal(err)
		}
	}
	before := s.local.Cloud.Faults().Calls("imds")
	for b.Loop() {
		if _, err := c.MetadataENIs(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.local.Cloud.Faults().Calls("imds")-before)/float64(b.N), "imds-gets/op")
}
