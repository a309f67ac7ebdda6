package providertest

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

func testSelf(t *testing.T, env Env) {
	self := mustSelf(t, env)
	if self.Type != env.InstanceType {
		t.Errorf("Self().Type = %q, want %q", self.Type, env.InstanceType)
	}
	if self.ID == "" || self.AvailabilityZone == "" || self.Region == "" || self.VPCID == "" || self.SubnetID == "" {
		t.Errorf("Self() lacks identity fields: %+v", self)
	}
	primary := mustCloudENI(t, env, self.PrimaryENI)
	if primary.InstanceID != self.ID || primary.DeviceNumber != 0 || primary.Status != "in-use" {
		t.Errorf("Self().PrimaryENI %s is %+v in the cloud, want in-use at device 0 of %s", self.PrimaryENI, primary, self.ID)
	}
	if self.PrimaryIP != primary.PrimaryIP || self.SubnetID != primary.SubnetID {
		t.Errorf("Self() primary %v in %s, cloud says %v in %s", self.PrimaryIP, self.SubnetID, primary.PrimaryIP, primary.SubnetID)
	}
	inVPC := slices.ContainsFunc(self.VPCCIDRs, func(p netip.Prefix) bool { return p.Contains(self.PrimaryIP) })
	if !inVPC {
		t.Errorf("Self().VPCCIDRs %v do not contain the primary address %v", self.VPCCIDRs, self.PrimaryIP)
	}
	if len(self.SecurityGroups) == 0 || self.PrimaryMAC == "" {
		t.Errorf("Self() lacks security groups or MAC: %+v", self)
	}
}

// testLimits checks the reported limits against what the cloud then allows:
// PodAddressesPerENI addresses fit on a new ENI and one more does not.
func testLimits(t *testing.T, env Env) {
	ctx := ctxFor(t)
	l, err := env.Provider.Limits(ctx, env.InstanceType)
	if err != nil {
		t.Fatalf("Limits(%s): %v", env.InstanceType, err)
	}
	if l.MaxENIs < 2 || l.IPv4PerENI < 2 || !l.PrefixDelegation {
		t.Fatalf("Limits(%s) = %+v; the suite needs a multi-ENI prefix-delegation type", env.InstanceType, l)
	}
	again, err := env.Provider.Limits(ctx, env.InstanceType)
	if err != nil || again != l {
		t.Errorf("second Limits(%s) = %+v, %v; want %+v", env.InstanceType, again, err, l)
	}
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: l.PodAddressesPerENI()})
	if got := len(eni.SecondaryIPs); got != l.PodAddressesPerENI() {
		t.Fatalf("CreateENI with %d addresses gave %d", l.PodAddressesPerENI(), got)
	}
	_, err = env.Provider.AssignAddresses(ctx, eni.ID, 1, false)
	if !errors.Is(err, provider.ErrAddressLimit) {
		t.Errorf("one address beyond Limits().IPv4PerENI: err = %v, want ErrAddressLimit", err)
	}
	if got := len(mustCloudENI(t, env, eni.ID).SecondaryIPs); got != l.PodAddressesPerENI() {
		t.Errorf("after the refused assign the cloud holds %d secondaries, want %d", got, l.PodAddressesPerENI())
	}
}

func testENIsPrimary(t *testing.T, env Env) {
	self := mustSelf(t, env)
	enis := mustENIs(t, env)
	if len(enis) != 1 {
		t.Fatalf("ENIs() of a fresh instance = %d ENIs, want 1", len(enis))
	}
	e := enis[0]
	if e.ID != self.PrimaryENI || e.DeviceNumber != 0 || e.PrimaryIP != self.PrimaryIP || e.MAC != self.PrimaryMAC {
		t.Errorf("ENIs()[0] = %+v, want the primary ENI %s (%s, %v) at device 0", e, self.PrimaryENI, self.PrimaryMAC, self.PrimaryIP)
	}
	if !e.SubnetCIDR.Contains(e.PrimaryIP) || e.Gateway != e.SubnetCIDR.Masked().Addr().Next() {
		t.Errorf("ENIs()[0] subnet %v gateway %v do not fit primary %v", e.SubnetCIDR, e.Gateway, e.PrimaryIP)
	}
	meta := mustMetadataENIs(t, env)
	if len(meta) != 1 || meta[0].ID != e.ID || meta[0].PrimaryIP != e.PrimaryIP || meta[0].SubnetCIDR != e.SubnetCIDR {
		t.Errorf("MetadataENIs() = %+v, want the primary ENI as ENIs() shows it", meta)
	}
}

func testCreateENIWithAddresses(t *testing.T, env Env) {
	self := mustSelf(t, env)
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: 4, Tags: map[string]string{"team": "net"}})
	if len(eni.SecondaryIPs) != 4 || eni.DeviceNumber != 1 || eni.SubnetID != self.SubnetID || !eni.SubnetCIDR.Contains(eni.PrimaryIP) {
		t.Errorf("CreateENI = %+v, want 4 secondaries at device 1 in %s", eni, self.SubnetID)
	}
	cloud := mustCloudENI(t, env, eni.ID)
	if cloud.Status != "in-use" || cloud.InstanceID != self.ID || cloud.DeviceNumber != 1 || !cloud.DeleteOnTermination {
		t.Errorf("cloud record of the new ENI = %+v, want in-use on %s at device 1 with delete-on-termination", cloud, self.ID)
	}
	if !equalPrefixes(cloud.Addresses(), addresses(eni)) || cloud.PrimaryIP != eni.PrimaryIP {
		t.Errorf("CreateENI returned %v, the cloud holds %v", addresses(eni), cloud.Addresses())
	}
	if cloud.Tags["team"] != "net" || len(cloud.Tags) < 4 {
		t.Errorf("cloud tags %v, want the extra tag plus node, cluster and creation-time tags", cloud.Tags)
	}
	listed, ok := findENI(mustENIs(t, env), eni.ID)
	if !ok || !equalPrefixes(addresses(listed), addresses(eni)) || listed.DeviceNumber != 1 || listed.MAC != eni.MAC {
		t.Errorf("ENIs() lists %+v (found %t), want %+v", listed, ok, eni)
	}
	meta, ok := findENI(mustMetadataENIs(t, env), eni.ID)
	if !ok || !equalPrefixes(addresses(meta), addresses(eni)) || meta.MAC != eni.MAC {
		t.Errorf("MetadataENIs() lists %+v (found %t), want %+v", meta, ok, eni)
	}
	second := mustCreate(t, env, provider.CreateENIRequest{Addresses: 1})
	if second.DeviceNumber != 2 {
		t.Errorf("second CreateENI at device %d, want 2 (the next free)", second.DeviceNumber)
	}
}

func testCreateENIWithPrefixes(t *testing.T, env Env) {
	eni := mustCreate(t, env, provider.CreateENIRequest{Prefixes: 2})
	if len(eni.Prefixes) != 2 || len(eni.SecondaryIPs) != 0 {
		t.Fatalf("CreateENI(Prefixes: 2) = %+v, want 2 prefixes and no secondaries", eni)
	}
	for _, p := range eni.Prefixes {
		if p.Bits() != 28 || p != p.Masked() || !eni.SubnetCIDR.Contains(p.Addr()) {
			t.Errorf("prefix %v is not an aligned /28 of %v", p, eni.SubnetCIDR)
		}
	}
	if cloud := mustCloudENI(t, env, eni.ID); !equalPrefixes(cloud.Prefixes, eni.Prefixes) {
		t.Errorf("cloud holds prefixes %v, CreateENI returned %v", cloud.Prefixes, eni.Prefixes)
	}
}

func testAssignUnassign(t *testing.T, env Env) {
	ctx := ctxFor(t)
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: 1})
	addrs, err := env.Provider.AssignAddresses(ctx, eni.ID, 3, false)
	if err != nil || len(addrs) != 3 {
		t.Fatalf("AssignAddresses(3) = %v, %v", addrs, err)
	}
	prefixes, err := env.Provider.AssignAddresses(ctx, eni.ID, 2, true)
	if err != nil || len(prefixes) != 2 || prefixes[0].Bits() != 28 {
		t.Fatalf("AssignAddresses(2 prefixes) = %v, %v", prefixes, err)
	}
	want := append(append(addresses(eni), addrs...), prefixes...)
	if got := mustCloudENI(t, env, eni.ID).Addresses(); !equalPrefixes(got, want) {
		t.Errorf("cloud holds %v, want %v", got, want)
	}
	listed, _ := findENI(mustENIs(t, env), eni.ID)
	if !equalPrefixes(addresses(listed), want) {
		t.Errorf("ENIs() shows %v, want %v", addresses(listed), want)
	}
	meta, _ := findENI(mustMetadataENIs(t, env), eni.ID)
	if !equalPrefixes(addresses(meta), want) {
		t.Errorf("MetadataENIs() shows %v, want %v", addresses(meta), want)
	}

	gone := []netip.Prefix{addrs[0], prefixes[1]}
	if err := env.Provider.UnassignAddresses(ctx, eni.ID, gone); err != nil {
		t.Fatalf("UnassignAddresses(%v): %v", gone, err)
	}
	want = slices.DeleteFunc(want, func(p netip.Prefix) bool { return contains(gone, p) })
	if got := mustCloudENI(t, env, eni.ID).Addresses(); !equalPrefixes(got, want) {
		t.Errorf("after unassign the cloud holds %v, want %v", got, want)
	}
	listed, _ = findENI(mustENIs(t, env), eni.ID)
	meta, _ = findENI(mustMetadataENIs(t, env), eni.ID)
	if !equalPrefixes(addresses(listed), want) || !equalPrefixes(addresses(meta), want) {
		t.Errorf("after unassign ENIs() shows %v and MetadataENIs() %v, want %v", addresses(listed), addresses(meta), want)
	}
	if err := env.Provider.UnassignAddresses(ctx, eni.ID, nil); err != nil {
		t.Errorf("UnassignAddresses(nothing) = %v, want nil", err)
	}
}

func testDeleteENI(t *testing.T, env Env) {
	ctx := ctxFor(t)
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: 2})
	if err := env.Provider.DeleteENI(ctx, eni.ID); err != nil {
		t.Fatalf("DeleteENI: %v", err)
	}
	if e, ok := env.Cloud.ENI(eni.ID); ok {
		t.Fatalf("after DeleteENI the cloud still has %s: %+v", eni.ID, e)
	}
	if err := env.Provider.DeleteENI(ctx, eni.ID); err != nil {
		t.Errorf("DeleteENI of an ENI already gone = %v, want nil", err)
	}
	if _, ok := findENI(mustENIs(t, env), eni.ID); ok {
		t.Errorf("ENIs() still lists the deleted %s", eni.ID)
	}
	if _, ok := findENI(mustMetadataENIs(t, env), eni.ID); ok {
		t.Errorf("MetadataENIs() still lists the deleted %s", eni.ID)
	}
	detached := mustCreate(t, env, provider.CreateENIRequest{})
	env.Cloud.DetachOutOfBand(t, detached.ID)
	if err := env.Provider.DeleteENI(ctx, detached.ID); err != nil {
		t.Fatalf("DeleteENI of an already detached ENI: %v", err)
	}
	if _, ok := env.Cloud.ENI(detached.ID); ok {
		t.Errorf("DeleteENI left the detached %s", detached.ID)
	}
	self := mustSelf(t, env)
	if err := env.Provider.DeleteENI(ctx, self.PrimaryENI); err == nil {
		t.Errorf("DeleteENI of the primary ENI succeeded")
	}
	if e := mustCloudENI(t, env, self.PrimaryENI); e.Status != "in-use" {
		t.Errorf("primary ENI is %s after a refused DeleteENI", e.Status)
	}
}

// testDeleteLeakedENIs leaks more ENIs than fit one page, as nodes dying
// between detach and delete do, next to ENIs that are not the cluster's.
func testDeleteLeakedENIs(t *testing.T, env Env) {
	ctx := ctxFor(t)
	var leaked []string
	for range env.PageSize + 1 {
		e := mustCreate(t, env, provider.CreateENIRequest{Addresses: 1})
		env.Cloud.DetachOutOfBand(t, e.ID)
		leaked = append(leaked, e.ID)
	}
	kept := mustCreate(t, env, provider.CreateENIRequest{})
	foreign := env.Cloud.CreateForeignENIs(t)

	young, err := env.Provider.DeleteLeakedENIs(ctx, time.Hour)
	if err != nil || len(young) != 0 {
		t.Fatalf("DeleteLeakedENIs(1h) = %v, %v; want nothing deleted (all younger)", young, err)
	}
	deleted, err := env.Provider.DeleteLeakedENIs(ctx, 0)
	if err != nil {
		t.Fatalf("DeleteLeakedENIs(0): %v", err)
	}
	slices.Sort(leaked)
	if !slices.Equal(deleted, leaked) {
		t.Errorf("DeleteLeakedENIs(0) = %v, want %v", deleted, leaked)
	}
	for _, id := range leaked {
		if _, ok := env.Cloud.ENI(id); ok {
			t.Errorf("leaked %s is still in the cloud", id)
		}
	}
	for _, id := range append(foreign, kept.ID) {
		if _, ok := env.Cloud.ENI(id); !ok {
			t.Errorf("%s, not a leak of this cluster, was deleted", id)
		}
	}
	again, err := env.Provider.DeleteLeakedENIs(ctx, 0)
	if err != nil || len(again) != 0 {
		t.Errorf("second DeleteLeakedENIs(0) = %v, %v; want nothing", again, err)
	}
}
