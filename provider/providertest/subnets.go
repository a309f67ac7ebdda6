package providertest

import (
	"errors"
	"maps"
	"testing"

	"github.com/vpcip/vpcip/provider"
)

// testSubnets checks Subnets by zone and by id: the instance's own subnet
// and the small one are listed in its zone with the cloud's tags, the other
// zone's subnet is not; free counts follow what an ENI takes; an unknown id
// is ErrNotFound.
func testSubnets(t *testing.T, env Env) {
	ctx := ctxFor(t)
	self := mustSelf(t, env)
	subnets, err := env.Provider.Subnets(ctx, provider.SubnetQuery{Zone: self.AvailabilityZone})
	if err != nil {
		t.Fatalf("Subnets(zone %s): %v", self.AvailabilityZone, err)
	}
	byID := map[string]provider.Subnet{}
	for i, s := range subnets {
		byID[s.ID] = s
		if s.AvailabilityZone != self.AvailabilityZone || s.VPCID != self.VPCID || !s.CIDR.IsValid() || s.Tags == nil {
			t.Errorf("Subnets(zone)[%d] = %+v, want zone %s, VPC %s, a CIDR and tags", i, s, self.AvailabilityZone, self.VPCID)
		}
		if i > 0 && subnets[i-1].ID >= s.ID {
			t.Errorf("Subnets not sorted by ID: %s before %s", subnets[i-1].ID, s.ID)
		}
	}
	own, ok := byID[self.SubnetID]
	if !ok || !own.CIDR.Contains(self.PrimaryIP) || own.FreeAddresses <= 0 {
		t.Errorf("the instance's subnet %s in the zone listing: %+v", self.SubnetID, own)
	}
	small, ok := byID[env.SmallSubnetID]
	if !ok || small.FreeAddresses != 11 || !maps.Equal(small.Tags, env.SmallSubnetTags) {
		t.Errorf("small subnet %s: %+v, want 11 free and tags %v", env.SmallSubnetID, small, env.SmallSubnetTags)
	}
	if _, ok := byID[env.OtherZoneSubnetID]; ok {
		t.Errorf("the zone listing has %s of another zone", env.OtherZoneSubnetID)
	}

	mustCreate(t, env, provider.CreateENIRequest{SubnetID: env.SmallSubnetID, Addresses: 2})
	got, err := env.Provider.Subnets(ctx, provider.SubnetQuery{IDs: []string{env.SmallSubnetID, env.OtherZoneSubnetID}})
	if err != nil || len(got) != 2 {
		t.Fatalf("Subnets(ids) = %+v, %v; want two", got, err)
	}
	for _, s := range got {
		if s.ID == env.SmallSubnetID && s.FreeAddresses != 8 {
			t.Errorf("small subnet after an ENI with 2 secondaries: %d free, want 8", s.FreeAddresses)
		}
	}
	got, err = env.Provider.Subnets(ctx, provider.SubnetQuery{IDs: []string{env.OtherZoneSubnetID}, Zone: self.AvailabilityZone})
	if err != nil || len(got) != 0 {
		t.Errorf("Subnets(other zone's id, this zone) = %+v, %v; want none", got, err)
	}
	_, err = env.Provider.Subnets(ctx, provider.SubnetQuery{IDs: []string{"subnet-0000000000000dead"}})
	if !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Subnets(unknown id): err = %v, want ErrNotFound", err)
	}
}
