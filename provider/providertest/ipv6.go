package providertest

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/vpcip/vpcip/provider"
)

// IPv6Env is an Env for RunIPv6: its Provider also implements
// provider.IPv6Assigner, the instance's subnet has an IPv6 CIDR block (a
// /64) and its type delegates /80 prefixes and holds at least 10 IPv6
// addresses per ENI.
type IPv6Env struct {
	Env
	// NoIPv6ENI is an ENI in a subnet of the VPC without an IPv6 CIDR block.
	NoIPv6ENI string
	// NoPrefixENI is the primary ENI of another instance, of a type with
	// IPv6 but without prefix delegation (a Xen type such as c4.large).
	NoPrefixENI string
}

// RunIPv6 runs the IPv6 contract (provider.IPv6Assigner) against
// environments made by newEnv.
func RunIPv6(t *testing.T, newEnv func(t *testing.T) IPv6Env) {
	tests := []struct {
		name string
		fn   func(t *testing.T, env IPv6Env, a provider.IPv6Assigner, eni string)
	}{
		{"Prefix", testIPv6Prefix},
		{"Addresses", testIPv6Addresses},
		{"SubnetWithoutIPv6", testIPv6NoSubnetCIDR},
		{"TypeWithoutPrefixes", testIPv6NoPrefixType},
		{"NotFound", testIPv6NotFound},
		{"BadInput", testIPv6BadInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			a, ok := env.Provider.(provider.IPv6Assigner)
			if !ok {
				t.Fatalf("%T does not implement provider.IPv6Assigner", env.Provider)
			}
			self, err := env.Provider.Self(ctxFor(t))
			if err != nil {
				t.Fatalf("Self: %v", err)
			}
			tt.fn(t, env, a, self.PrimaryENI)
		})
	}
}

// cloudIPv6 returns what the cloud says the ENI holds, /128s and /80s sorted.
func cloudIPv6(t *testing.T, env IPv6Env, id string) []netip.Prefix {
	t.Helper()
	e := mustCloudENI(t, env.Env, id)
	var out []netip.Prefix
	for _, a := range e.IPv6Addresses {
		out = append(out, netip.PrefixFrom(a, 128))
	}
	return sortPrefixes(append(out, e.IPv6Prefixes...))
}

// testIPv6Prefix: one /80 is added, the cloud holds it, unassigning frees it.
func testIPv6Prefix(t *testing.T, env IPv6Env, a provider.IPv6Assigner, eni string) {
	got, err := a.AssignIPv6(ctxFor(t), eni, 1, true)
	if err != nil {
		t.Fatalf("AssignIPv6(1 prefix): %v", err)
	}
	if len(got) != 1 || got[0].Bits() != 80 || got[0].Masked() != got[0] || !got[0].Addr().Is6() {
		t.Fatalf("AssignIPv6(1 prefix) = %v, want one aligned IPv6 /80", got)
	}
	if c := cloudIPv6(t, env, eni); !slices.Equal(c, got) {
		t.Fatalf("the cloud holds %v on %s, the provider said %v", c, eni, got)
	}
	if err := a.UnassignIPv6(ctxFor(t), eni, got); err != nil {
		t.Fatalf("UnassignIPv6(%v): %v", got, err)
	}
	if c := cloudIPv6(t, env, eni); len(c) != 0 {
		t.Fatalf("after UnassignIPv6 the cloud still holds %v", c)
	}
}

// testIPv6Addresses: n addresses are added as distinct /128s and go again.
func testIPv6Addresses(t *testing.T, env IPv6Env, a provider.IPv6Assigner, eni string) {
	got, err := a.AssignIPv6(ctxFor(t), eni, 3, false)
	if err != nil {
		t.Fatalf("AssignIPv6(3 addresses): %v", err)
	}
	if len(got) != 3 || slices.ContainsFunc(got, func(p netip.Prefix) bool { return p.Bits() != 128 || !p.Addr().Is6() }) || len(slices.Compact(slices.Clone(got))) != 3 {
		t.Fatalf("AssignIPv6(3 addresses) = %v, want 3 distinct IPv6 /128s", got)
	}
	if c := cloudIPv6(t, env, eni); !slices.Equal(c, got) {
		t.Fatalf("the cloud holds %v on %s, the provider said %v", c, eni, got)
	}
	if err := a.UnassignIPv6(ctxFor(t), eni, got[:2]); err != nil {
		t.Fatalf("UnassignIPv6: %v", err)
	}
	if c := cloudIPv6(t, env, eni); !slices.Equal(c, got[2:]) {
		t.Fatalf("after unassigning two the cloud holds %v, want %v", c, got[2:])
	}
}

// refusedIPv6 checks that the cloud refused an assignment and that the ENI
// holds what it held before.
func refusedIPv6(t *testing.T, env IPv6Env, eni string, call func() ([]netip.Prefix, error)) error {
	t.Helper()
	before := cloudIPv6(t, env, eni)
	calls := env.Cloud.Calls("AssignIpv6Addresses")
	got, err := call()
	if err == nil {
		t.Fatalf("assignment on %s succeeded with %v; want the cloud's refusal", eni, got)
	}
	if env.Cloud.Calls("AssignIpv6Addresses") != calls+1 {
		t.Fatalf("the refusal is not the cloud's: %d AssignIpv6Addresses calls, want 1", env.Cloud.Calls("AssignIpv6Addresses")-calls)
	}
	if after := cloudIPv6(t, env, eni); !slices.Equal(before, after) {
		t.Fatalf("a refused assignment changed %s: %v → %v", eni, before, after)
	}
	return err
}

// testIPv6NoSubnetCIDR: an ENI in a subnet without an IPv6 CIDR block gets
// neither addresses nor prefixes.
func testIPv6NoSubnetCIDR(t *testing.T, env IPv6Env, a provider.IPv6Assigner, _ string) {
	for _, prefix := range []bool{false, true} {
		err := refusedIPv6(t, env, env.NoIPv6ENI, func() ([]netip.Prefix, error) { return a.AssignIPv6(ctxFor(t), env.NoIPv6ENI, 1, prefix) })
		t.Logf("subnet without IPv6, prefix %v: refused: %v", prefix, err)
	}
}

// testIPv6NoPrefixType: a type without prefix delegation gets addresses but
// no /80.
func testIPv6NoPrefixType(t *testing.T, env IPv6Env, a provider.IPv6Assigner, _ string) {
	err := refusedIPv6(t, env, env.NoPrefixENI, func() ([]netip.Prefix, error) { return a.AssignIPv6(ctxFor(t), env.NoPrefixENI, 1, true) })
	t.Logf("/80 on a type without prefixes: refused: %v", err)
	got, err := a.AssignIPv6(ctxFor(t), env.NoPrefixENI, 1, false)
	if err != nil || len(got) != 1 {
		t.Fatalf("AssignIPv6(1 address) on the prefix-less type = %v, %v; want one address", got, err)
	}
}

// testIPv6NotFound: an unknown ENI is ErrNotFound.
func testIPv6NotFound(t *testing.T, env IPv6Env, a provider.IPv6Assigner, _ string) {
	if _, err := a.AssignIPv6(ctxFor(t), "eni-0123456789abcdef0", 1, true); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("AssignIPv6 on an unknown ENI: %v, want ErrNotFound", err)
	}
	if err := a.UnassignIPv6(ctxFor(t), "eni-0123456789abcdef0", []netip.Prefix{netip.MustParsePrefix("2600:1f14::10/128")}); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("UnassignIPv6 on an unknown ENI: %v, want ErrNotFound", err)
	}
}

// testIPv6BadInput: bad requests are refused before any cloud call.
func testIPv6BadInput(t *testing.T, env IPv6Env, a provider.IPv6Assigner, eni string) {
	assigns, unassigns := env.Cloud.Calls("AssignIpv6Addresses"), env.Cloud.Calls("UnassignIpv6Addresses")
	if _, err := a.AssignIPv6(ctxFor(t), eni, 0, true); err == nil {
		t.Fatal("AssignIPv6 with count 0 succeeded")
	}
	for _, bad := range []netip.Prefix{netip.MustParsePrefix("100.64.0.10/32"), netip.MustParsePrefix("2600:1f14::/64"), netip.MustParsePrefix("2600:1f14::1/80")} {
		if err := a.UnassignIPv6(ctxFor(t), eni, []netip.Prefix{bad}); err == nil {
			t.Fatalf("UnassignIPv6(%s) succeeded", bad)
		}
	}
	if err := a.UnassignIPv6(ctxFor(t), eni, nil); err != nil {
		t.Fatalf("UnassignIPv6(nothing): %v", err)
	}
	if env.Cloud.Calls("AssignIpv6Addresses") != assigns || env.Cloud.Calls("UnassignIpv6Addresses") != unassigns {
		t.Fatal("bad input reached the cloud")
	}
}
