package providertest

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vpcip/vpcip/provider"
)

// testLagNewAddresses: with metadata lagging, AssignAddresses and CreateENI
// return only once instance metadata itself shows what they made.
func testLagNewAddresses(t *testing.T, env Env) {
	ctx := ctxFor(t)
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: 1})
	env.Cloud.SetMetadataLag(env.MetadataLag)
	added, err := env.Provider.AssignAddresses(ctx, eni.ID, 2, false)
	if err != nil {
		t.Fatalf("AssignAddresses under a %s metadata lag: %v", env.MetadataLag, err)
	}
	for _, p := range added {
		if !env.Cloud.MetadataLists(t, eni.ID, p) {
			t.Errorf("AssignAddresses returned %v before instance metadata shows it", p)
		}
	}
	meta, _ := findENI(mustMetadataENIs(t, env), eni.ID)
	for _, p := range added {
		if !contains(addresses(meta), p) {
			t.Errorf("MetadataENIs() lacks %v, which metadata shows", p)
		}
	}
	created := mustCreate(t, env, provider.CreateENIRequest{Addresses: 2})
	for _, p := range append(addresses(created), netip.PrefixFrom(created.PrimaryIP, 32)) {
		if !env.Cloud.MetadataLists(t, created.ID, p) {
			t.Errorf("CreateENI returned before instance metadata shows %v on %s", p, created.ID)
		}
	}
}

// testLagOmission: metadata falls behind after addresses and an ENI became
// visible and omits them for a while; MetadataENIs keeps reporting them,
// because the cloud's API never said they were gone.
func testLagOmission(t *testing.T, env Env) {
	ctx := ctxFor(t)
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: 1})
	added, err := env.Provider.AssignAddresses(ctx, eni.ID, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	prefix, err := env.Provider.AssignAddresses(ctx, eni.ID, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	added = append(added, prefix...)
	late := mustCreate(t, env, provider.CreateENIRequest{})
	want := append(addresses(eni), added...)
	if got, _ := findENI(mustMetadataENIs(t, env), eni.ID); !equalPrefixes(addresses(got), want) {
		t.Fatalf("MetadataENIs() = %v before the lag, want %v", addresses(got), want)
	}

	env.Cloud.SetMetadataLag(env.MetadataLag)
	omitted := slices.DeleteFunc(slices.Clone(added), func(p netip.Prefix) bool { return env.Cloud.MetadataLists(t, eni.ID, p) })
	if len(omitted) == 0 || env.Cloud.MetadataLists(t, late.ID, netip.PrefixFrom(late.PrimaryIP, 32)) {
		t.Fatalf("metadata still lists %v or ENI %s under the lag; the test cannot show anything", added, late.ID)
	}
	metaENIs := mustMetadataENIs(t, env)
	got, ok := findENI(metaENIs, eni.ID)
	if !ok {
		t.Fatalf("MetadataENIs() dropped %s while metadata lags", eni.ID)
	}
	for _, p := range omitted {
		if !contains(addresses(got), p) {
			t.Errorf("MetadataENIs() reports %v as removed on stale metadata's word", p)
		}
	}
	if _, ok := findENI(metaENIs, late.ID); !ok {
		t.Errorf("MetadataENIs() dropped ENI %s while stale metadata omits it", late.ID)
	}
	listed, _ := findENI(mustENIs(t, env), eni.ID)
	if !equalPrefixes(addresses(listed), addresses(got)) {
		t.Errorf("under the lag MetadataENIs() shows %v, ENIs() %v", addresses(got), addresses(listed))
	}
	if got, _ := findENI(mustMetadataENIs(t, env), eni.ID); !equalPrefixes(addresses(got), want) {
		t.Errorf("after ENIs() confirmed them, MetadataENIs() = %v, want %v", addresses(got), want)
	}
}

// testLagUnassigned: after an unassign, lagging metadata still lists the
// address; MetadataENIs follows the cloud's API and no longer reports it.
func testLagUnassigned(t *testing.T, env Env) {
	ctx := ctxFor(t)
	env.Cloud.SetMetadataLag(env.MetadataLag)
	eni := mustCreate(t, env, provider.CreateENIRequest{Addresses: 3})
	gone := netip.PrefixFrom(eni.SecondaryIPs[0], 32)
	if err := env.Provider.UnassignAddresses(ctx, eni.ID, []netip.Prefix{gone}); err != nil {
		t.Fatal(err)
	}
	if !env.Cloud.MetadataLists(t, eni.ID, gone) {
		t.Fatalf("metadata no longer lists %v right after the unassign; the test cannot show anything", gone)
	}
	got, _ := findENI(mustMetadataENIs(t, env), eni.ID)
	if contains(addresses(got), gone) || len(got.SecondaryIPs) != 2 {
		t.Errorf("MetadataENIs() shows %v after %v was unassigned, want the other two", got.SecondaryIPs, gone)
	}
	deleted := mustCreate(t, env, provider.CreateENIRequest{})
	if err := env.Provider.DeleteENI(ctx, deleted.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := findENI(mustMetadataENIs(t, env), deleted.ID); ok {
		t.Errorf("MetadataENIs() lists %s after DeleteENI, on stale metadata's word", deleted.ID)
	}
}
