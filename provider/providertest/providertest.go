// Package providertest is the contract of provider.Provider as one test
// suite. A backend's tests call Run with a constructor of fresh
// environments: a cloud with one launched instance, a Provider bound to that
// instance, and hooks that let the suite inject faults into the cloud and
// read the cloud's own state without going through the Provider.
//
// Every sentinel error is provoked by a refusal of the cloud itself (a full
// subnet, a full ENI, an instance out of ENI slots, an empty request-rate
// bucket, an unknown ENI or instance type); only the authorization refusal,
// which a cloud without IAM cannot produce on its own, is injected into the
// cloud's API with Cloud.FailNext. The suite uses EC2 action names and error
// codes as the cloud's vocabulary.
package providertest

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// Env is one fresh cloud with one running instance and a Provider bound to
// it. Run calls the constructor once per subtest.
type Env struct {
	// Provider is the backend under test, acting as the launched instance.
	Provider provider.Provider
	// InstanceType of the instance. The suite needs prefix delegation, at
	// least 6 ENIs and at least 10 addresses per ENI (c5.4xlarge: 8 × 30).
	InstanceType string
	// PageSize is the page size the Provider asks for when it lists ENIs;
	// the suite makes listings longer than one page.
	PageSize int
	// SmallSubnetID is a /28 subnet in the instance's availability zone
	// (11 usable addresses, no free aligned /28 once an ENI is in it).
	SmallSubnetID string
	// SmallSubnetTags are the tags the cloud has on SmallSubnetID (at least one).
	SmallSubnetTags map[string]string
	// OtherZoneSubnetID is a subnet of the instance's VPC in another
	// availability zone.
	OtherZoneSubnetID string
	// MetadataLag is the instance-metadata lag the lag tests use (several
	// seconds keeps them meaningful; it is also how long they take).
	MetadataLag time.Duration
	// Cloud gives the suite the cloud's side.
	Cloud Cloud
}

// Cloud is the cloud's side of an Env: fault injection and model state.
type Cloud interface {
	// FailNext makes the next call of the EC2 action op fail with the EC2
	// error code.
	FailNext(op, code string)
	// SetThrottle sets the account's request-rate bucket of mutating or of
	// describe calls (calls per second, burst in calls); 0 turns it off.
	SetThrottle(mutating bool, perSecond float64, burst int)
	// SetMetadataLag makes instance metadata show the cloud as it was d ago.
	SetMetadataLag(d time.Duration)
	// Calls counts the requests of the EC2 action op the cloud received.
	Calls(op string) int
	// ENI returns the cloud's record of an ENI, false if it does not exist.
	ENI(id string) (CloudENI, bool)
	// ENIIDs lists every ENI in the cloud, attached or not.
	ENIIDs() []string
	// MetadataLists reads instance metadata directly and reports whether it
	// lists p (a /32 address or a /28 prefix) on the ENI now.
	MetadataLists(t *testing.T, eniID string, p netip.Prefix) bool
	// DetachOutOfBand detaches an ENI without deleting it, as a node that
	// dies between detach and delete leaves it, and returns once it is
	// available.
	DetachOutOfBand(t *testing.T, eniID string)
	// CreateForeignENIs creates available ENIs in the instance's subnet that
	// are not the cluster's (untagged, another cluster's) and returns their ids.
	CreateForeignENIs(t *testing.T) []string
}

// CloudENI is the cloud's record of one ENI.
type CloudENI struct {
	Status              string // "available" | "in-use"
	InstanceID          string // attached instance, "" when available
	DeviceNumber        int
	DeleteOnTermination bool
	SubnetID            string
	PrimaryIP           netip.Addr
	SecondaryIPs        []netip.Addr
	Prefixes            []netip.Prefix
	IPv6Addresses       []netip.Addr   // in assignment order
	IPv6Prefixes        []netip.Prefix // /80s, in assignment order
	Tags                map[string]string
}

// Addresses returns the ENI's secondary addresses as /32s and its prefixes,
// sorted.
func (e CloudENI) Addresses() []netip.Prefix {
	var out []netip.Prefix
	for _, a := range e.SecondaryIPs {
		out = append(out, netip.PrefixFrom(a, 32))
	}
	out = append(out, e.Prefixes...)
	return sortPrefixes(out)
}

// Run runs the contract against environments made by newEnv.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	tests := []struct {
		name string
		fn   func(t *testing.T, env Env)
	}{
		{"Self", testSelf},
		{"Limits", testLimits},
		{"ENIsPrimary", testENIsPrimary},
		{"CreateENIWithAddresses", testCreateENIWithAddresses},
		{"CreateENIWithPrefixes", testCreateENIWithPrefixes},
		{"AssignUnassign", testAssignUnassign},
		{"DeleteENIIdempotent", testDeleteENI},
		{"DeleteLeakedENIs", testDeleteLeakedENIs},
		{"ENILimitRollsBackAndPages", testENILimit},
		{"AttachFailureRollsBack", testAttachFailure},
		{"AddressLimit", testAddressLimit},
		{"SubnetFull", testSubnetFull},
		{"InsufficientCIDR", testInsufficientCIDR},
		{"NotFound", testNotFound},
		{"Unauthorized", testUnauthorized},
		{"Throttled", testThrottled},
		{"BadInput", testBadInput},
		{"Subnets", testSubnets},
		{"MetadataLagNewAddresses", testLagNewAddresses},
		{"MetadataLagOmission", testLagOmission},
		{"MetadataLagUnassigned", testLagUnassigned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newEnv(t))
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sortPrefixes(ps []netip.Prefix) []netip.Prefix {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return ps
}

// addresses returns an ENI's secondary addresses as /32s and its prefixes, sorted.
func addresses(e provider.ENI) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range e.SecondaryIPs {
		out = append(out, netip.PrefixFrom(a, 32))
	}
	out = append(out, e.Prefixes...)
	return sortPrefixes(out)
}

// mustCloudENI returns the cloud's record of an ENI, failing the test if
// the cloud has none.
func mustCloudENI(t *testing.T, env Env, id string) CloudENI {
	t.Helper()
	e, ok := env.Cloud.ENI(id)
	if !ok {
		t.Fatalf("the cloud has no ENI %s", id)
	}
	return e
}

// findENI returns the ENI with id from a listing.
func findENI(enis []provider.ENI, id string) (provider.ENI, bool) {
	for _, e := range enis {
		if e.ID == id {
			return e, true
		}
	}
	return provider.ENI{}, false
}

func mustENIs(t *testing.T, env Env) []provider.ENI {
	t.Helper()
	enis, err := env.Provider.ENIs(ctxFor(t))
	if err != nil {
		t.Fatalf("ENIs: %v", err)
	}
	return enis
}

func mustMetadataENIs(t *testing.T, env Env) []provider.ENI {
	t.Helper()
	enis, err := env.Provider.MetadataENIs(ctxFor(t))
	if err != nil {
		t.Fatalf("MetadataENIs: %v", err)
	}
	return enis
}

func mustCreate(t *testing.T, env Env, req provider.CreateENIRequest) provider.ENI {
	t.Helper()
	eni, err := env.Provider.CreateENI(ctxFor(t), req)
	if err != nil {
		t.Fatalf("CreateENI(%+v): %v", req, err)
	}
	return eni
}

func mustSelf(t *testing.T, env Env) provider.Instance {
	t.Helper()
	self, err := env.Provider.Self(ctxFor(t))
	if err != nil {
		t.Fatalf("Self: %v", err)
	}
	return self
}

func equalPrefixes(a, b []netip.Prefix) bool {
	return slices.Equal(sortPrefixes(a), sortPrefixes(b))
}

func contains(ps []netip.Prefix, p netip.Prefix) bool { return slices.Contains(ps, p) }
