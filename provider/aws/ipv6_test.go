package awsprovider

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider/providertest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestContractIPv6 runs the IPv6 contract against vpcsim: the instance's
// subnet has a /64, another subnet none; a c4.large (Xen: IPv6, no prefix
// delegation) stands beside the instance.
func TestContractIPv6(t *testing.T) {
	providertest.RunIPv6(t, func(t *testing.T) providertest.IPv6Env {
		l := vpcsimtest.Start(t, vpcsim.Config{Subnets: []vpcsim.SubnetSpec{
			{CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: testZone},
			{CIDR: netip.MustParsePrefix("100.64.16.0/20"), AvailabilityZone: testZone, NoIPv6: true},
		}})
		s := &sim{local: l, inst: l.Launch(t, testType)}
		var noV6 string
		for _, sub := range l.Cloud.Subnets() {
			if !sub.IPv6CIDR.IsValid() {
				noV6 = sub.ID
			}
		}
		inNoV6, err := l.Cloud.LaunchInstance(testType, noV6)
		if err != nil {
			t.Fatal(err)
		}
		xen, err := l.Cloud.LaunchInstance("c4.large", "")
		if err != nil {
			t.Fatal(err)
		}
		return providertest.IPv6Env{
			Env: providertest.Env{
				Provider: s.client(t, testOptions(), ""), InstanceType: testType, PageSize: testPageSize,
				MetadataLag: time.Second, Cloud: simCloud{s},
			},
			NoIPv6ENI:   inNoV6.PrimaryENI.ID,
			NoPrefixENI: xen.PrimaryENI.ID,
		}
	})
}
