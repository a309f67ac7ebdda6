package providertest

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// testENILimit fills the instance's ENI slots, checks that the listing spans
// more than one page, and that the refused attach of one more ENI leaves no
// ENI behind.
func testENILimit(t *testing.T, env Env) {
	ctx := ctxFor(t)
	l, err := env.Provider.Limits(ctx, env.InstanceType)
	if err != nil {
		t.Fatal(err)
	}
	if l.MaxENIs <= env.PageSize {
		t.Fatalf("%s has %d ENIs, not more than the page size %d", env.InstanceType, l.MaxENIs, env.PageSize)
	}
	for range l.MaxENIs - 1 {
		mustCreate(t, env, provider.CreateENIRequest{Addresses: 1})
	}
	before := env.Cloud.Calls("DescribeNetworkInterfaces")
	enis := mustENIs(t, env)
	if pages := env.Cloud.Calls("DescribeNetworkInterfaces") - before; pages < 2 {
		t.Errorf("listing %d ENIs with page size %d took %d DescribeNetworkInterfaces calls, want at least 2", len(enis), env.PageSize, pages)
	}
	if len(enis) != l.MaxENIs {
		t.Fatalf("ENIs() lists %d ENIs, want %d", len(enis), l.MaxENIs)
	}
	for i, e := range enis {
		if e.DeviceNumber != i {
			t.Errorf("ENIs()[%d] at device %d, want sorted device numbers 0..%d", i, e.DeviceNumber, l.MaxENIs-1)
		}
	}
	all := env.Cloud.ENIIDs()
	_, err = env.Provider.CreateENI(ctx, provider.CreateENIRequest{Addresses: 1})
	if !errors.Is(err, provider.ErrENILimit) {
		t.Fatalf("CreateENI beyond %d ENIs: err = %v, want ErrENILimit", l.MaxENIs, err)
	}
	if after := env.Cloud.ENIIDs(); !slices.Equal(sorted(after), sorted(all)) {
		t.Errorf("the refused CreateENI left ENIs behind: before %v, after %v", all, after)
	}
}

// testAttachFailure fails the attach inside the cloud and checks the new
// ENI is deleted again.
func testAttachFailure(t *testing.T, env Env) {
	all := env.Cloud.ENIIDs()
	env.Cloud.FailNext("AttachNetworkInterface", "InternalError")
	_, err := env.Provider.CreateENI(ctxFor(t), provider.CreateENIRequest{Addresses: 2})
	if err == nil {
		t.Fatal("CreateENI succeeded although its attach failed")
	}
	if after := env.Cloud.ENIIDs(); !slices.Equal(sorted(after), sorted(all)) {
		t.Errorf("the failed CreateENI left ENIs behind: before %v, after %v", all, after)
	}
	if len(mustENIs(t, env)) != 1 {
		t.Errorf("ENIs() lists more than the primary after the failed CreateENI")
	}
}

func testAddressLimit(t *testing.T, env Env) {
	ctx := ctxFor(t)
	self := mustSelf(t, env)
	l, err := env.Provider.Limits(ctx, env.InstanceType)
	if err != nil {
		t.Fatal(err)
	}
	before := mustCloudENI(t, env, self.PrimaryENI).Addresses()
	_, err = env.Provider.AssignAddresses(ctx, self.PrimaryENI, l.IPv4PerENI, false)
	if !errors.Is(err, provider.ErrAddressLimit) {
		t.Errorf("AssignAddresses(%d) on an ENI of %d addresses: err = %v, want ErrAddressLimit", l.IPv4PerENI, l.IPv4PerENI, err)
	}
	if after := mustCloudENI(t, env, self.PrimaryENI).Addresses(); !equalPrefixes(after, before) {
		t.Errorf("the refused assign changed the ENI: %v → %v", before, after)
	}
	_, err = env.Provider.CreateENI(ctx, provider.CreateENIRequest{Addresses: l.IPv4PerENI})
	if !errors.Is(err, provider.ErrAddressLimit) {
		t.Errorf("CreateENI with %d addresses: err = %v, want ErrAddressLimit", l.IPv4PerENI, err)
	}
}

func testSubnetFull(t *testing.T, env Env) {
	all := env.Cloud.ENIIDs()
	_, err := env.Provider.CreateENI(ctxFor(t), provider.CreateENIRequest{SubnetID: env.SmallSubnetID, Addresses: 12})
	if !errors.Is(err, provider.ErrSubnetFull) {
		t.Errorf("CreateENI with 13 addresses in a /28: err = %v, want ErrSubnetFull", err)
	}
	if after := env.Cloud.ENIIDs(); !slices.Equal(sorted(after), sorted(all)) {
		t.Errorf("the refused CreateENI left ENIs behind: %v → %v", all, after)
	}
	eni := mustCreate(t, env, provider.CreateENIRequest{SubnetID: env.SmallSubnetID, Addresses: 9})
	_, err = env.Provider.AssignAddresses(ctxFor(t), eni.ID, 2, false)
	if !errors.Is(err, provider.ErrSubnetFull) {
		t.Errorf("AssignAddresses(2) with one address left in the subnet: err = %v, want ErrSubnetFull", err)
	}
	if got := len(mustCloudENI(t, env, eni.ID).SecondaryIPs); got != 9 {
		t.Errorf("the refused assign left %d secondaries, want 9", got)
	}
}

func testInsufficientCIDR(t *testing.T, env Env) {
	ctx := ctxFor(t)
	_, err := env.Provider.CreateENI(ctx, provider.CreateENIRequest{SubnetID: env.SmallSubnetID, Prefixes: 1})
	if !errors.Is(err, provider.ErrInsufficientCIDR) {
		t.Errorf("CreateENI with a prefix in a /28 subnet: err = %v, want ErrInsufficientCIDR", err)
	}
	eni := mustCreate(t, env, provider.CreateENIRequest{SubnetID: env.SmallSubnetID})
	_, err = env.Provider.AssignAddresses(ctx, eni.ID, 1, true)
	if !errors.Is(err, provider.ErrInsufficientCIDR) {
		t.Errorf("AssignAddresses(1 prefix) in a /28 subnet with free addresses: err = %v, want ErrInsufficientCIDR", err)
	}
	if got := mustCloudENI(t, env, eni.ID).Prefixes; len(got) != 0 {
		t.Errorf("the refused assign left prefixes %v", got)
	}
}

func testNotFound(t *testing.T, env Env) {
	ctx := ctxFor(t)
	const missing = "eni-0f0f0f0f0f0f0f0f0"
	if _, err := env.Provider.AssignAddresses(ctx, missing, 1, false); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("AssignAddresses on a missing ENI: err = %v, want ErrNotFound", err)
	}
	err := env.Provider.UnassignAddresses(ctx, missing, []netip.Prefix{netip.MustParsePrefix("100.64.0.77/32")})
	if !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("UnassignAddresses on a missing ENI: err = %v, want ErrNotFound", err)
	}
	if _, err := env.Provider.CreateENI(ctx, provider.CreateENIRequest{SubnetID: "subnet-0f0f0f0f0f0f0f0f0"}); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("CreateENI in a missing subnet: err = %v, want ErrNotFound", err)
	}
	if _, err := env.Provider.Limits(ctx, "zz9.plural"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Limits of an unknown type: err = %v, want ErrNotFound", err)
	}
	if err := env.Provider.DeleteENI(ctx, missing); err != nil {
		t.Errorf("DeleteENI of a missing ENI = %v, want nil", err)
	}
}

// testUnauthorized injects the refusal: the cloud has no IAM to produce it.
func testUnauthorized(t *testing.T, env Env) {
	self := mustSelf(t, env)
	before := mustCloudENI(t, env, self.PrimaryENI).Addresses()
	env.Cloud.FailNext("AssignPrivateIpAddresses", "UnauthorizedOperation")
	_, err := env.Provider.AssignAddresses(ctxFor(t), self.PrimaryENI, 1, false)
	if !errors.Is(err, provider.ErrUnauthorized) {
		t.Errorf("AssignAddresses refused as unauthorized: err = %v, want ErrUnauthorized", err)
	}
	if after := mustCloudENI(t, env, self.PrimaryENI).Addresses(); !equalPrefixes(after, before) {
		t.Errorf("the refused assign changed the ENI: %v → %v", before, after)
	}
}

// testThrottled empties the account's mutating bucket: a call that cannot
// be served before its deadline fails with ErrThrottled, and nothing changes.
func testThrottled(t *testing.T, env Env) {
	self := mustSelf(t, env)
	env.Cloud.SetThrottle(true, 0.001, 1)
	if _, err := env.Provider.AssignAddresses(ctxFor(t), self.PrimaryENI, 1, false); err != nil {
		t.Fatalf("first AssignAddresses (the bucket's one token): %v", err)
	}
	before := mustCloudENI(t, env, self.PrimaryENI).Addresses()
	ctx, cancel := context.WithTimeout(ctxFor(t), 1500*time.Millisecond)
	defer cancel()
	_, err := env.Provider.AssignAddresses(ctx, self.PrimaryENI, 1, false)
	if !errors.Is(err, provider.ErrThrottled) {
		t.Errorf("AssignAddresses against an empty bucket: err = %v, want ErrThrottled", err)
	}
	if after := mustCloudENI(t, env, self.PrimaryENI).Addresses(); !equalPrefixes(after, before) {
		t.Errorf("the throttled assign changed the ENI: %v → %v", before, after)
	}
	env.Cloud.SetThrottle(true, 0, 0)
	if _, err := env.Provider.AssignAddresses(ctxFor(t), self.PrimaryENI, 1, false); err != nil {
		t.Errorf("AssignAddresses after throttling ended: %v", err)
	}
}

func testBadInput(t *testing.T, env Env) {
	ctx := ctxFor(t)
	self := mustSelf(t, env)
	all := env.Cloud.ENIIDs()
	for _, req := range []provider.CreateENIRequest{{Addresses: 1, Prefixes: 1}, {Addresses: -1}} {
		if _, err := env.Provider.CreateENI(ctx, req); err == nil {
			t.Errorf("CreateENI(%+v) succeeded", req)
		}
	}
	if _, err := env.Provider.AssignAddresses(ctx, self.PrimaryENI, 0, false); err == nil {
		t.Errorf("AssignAddresses(0) succeeded")
	}
	bad := []netip.Prefix{netip.MustParsePrefix("100.64.0.0/24")}
	if err := env.Provider.UnassignAddresses(ctx, self.PrimaryENI, bad); err == nil {
		t.Errorf("UnassignAddresses(%v) succeeded", bad)
	}
	if after := env.Cloud.ENIIDs(); !slices.Equal(sorted(after), sorted(all)) {
		t.Errorf("bad requests changed the cloud's ENIs: %v → %v", all, after)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
