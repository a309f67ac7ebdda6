package ipamd

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vpcip/vpcip/provider"
)

// IPv6 mode (ENABLE_IPv6=true with ENABLE_PREFIX_DELEGATION=true and
// ENABLE_IPv4=false, the AWS VPC CNI's IPv6 mode): pods get addresses from
// one /80 prefix on the primary ENI. The daemon assigns it once at start-up
// (EC2 AssignIpv6Addresses with Ipv6PrefixCount=1), or finds the one it
// assigned before a restart, keeps it for good and makes no other EC2 call
// for addresses: a /80 holds 2^48 addresses, more than any node runs pods,
// so there is no warm pool to grow or shrink, no secondary ENI and nothing
// to release (the worker runs no pool cycle, no EC2 resync and no
// leaked-ENI sweep in this mode; see worker.loop). The datastore holds the
// /80 as a lazy slot (datastore.LazySlotBits) and knows only the addresses
// it handed out.

// fatalError is a start-up error retrying cannot fix: the daemon stops
// with it instead of waiting for the cloud.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

func fatalf(format string, args ...any) error {
	return &fatalError{fmt.Errorf(format, args...)}
}

// family keeps, of each ENI, the slots of the configured address family:
// the IPv4 secondary addresses and /28 prefixes, or in IPv6 mode the /80
// prefixes. An IPv4 node never hands out an IPv6 address someone else
// assigned to its ENIs, nor an IPv6 node an IPv4 one.
func (r *reconciler) family(enis []provider.ENI) []provider.ENI {
	out := make([]provider.ENI, len(enis))
	for i, e := range enis {
		if r.cfg.IPv6 {
			e.SecondaryIPs, e.Prefixes = nil, nil
		} else {
			e.IPv6Prefixes = nil
		}
		out[i] = e
	}
	return out
}

// ensureIPv6Prefix makes sure the primary ENI in enis (EC2's answer) holds
// an IPv6 /80: the first one it holds is kept (after a restart, the one
// assigned before); without one, it assigns one (EC2 AssignIpv6Addresses,
// Ipv6PrefixCount=1) and returns enis with it. A subnet without an IPv6
// CIDR block (instance metadata lists none) and an instance type without
// prefix delegation are fatal, named before any EC2 call; EC2's refusals
// are returned for the start-up's retry, with EC2's message.
func (r *reconciler) ensureIPv6Prefix(ctx context.Context, self provider.Instance, lim provider.Limits, enis []provider.ENI) ([]provider.ENI, error) {
	i := slices.IndexFunc(enis, func(e provider.ENI) bool { return e.ID == self.PrimaryENI })
	if i < 0 {
		return nil, fmt.Errorf("EC2 does not list the primary ENI %s yet", self.PrimaryENI)
	}
	if have := enis[i].IPv6Prefixes; len(have) > 0 {
		if len(have) > 1 {
			r.log.Warn("the primary ENI holds more than one IPv6 /80: pods get addresses from all of them, none is released",
				"eni", self.PrimaryENI, "prefixes", have)
		}
		r.log.Info("IPv6 mode: using the /80 the primary ENI holds", "eni", self.PrimaryENI, "prefix", have[0])
		return enis, nil
	}
	if !self.SubnetIPv6CIDR.IsValid() {
		return nil, fatalf("ENABLE_IPv6=true: subnet %s of the primary ENI %s has no IPv6 CIDR block (instance metadata lists none); associate one with the subnet, or run with ENABLE_IPv6=false",
			self.SubnetID, self.PrimaryENI)
	}
	if !lim.PrefixDelegation {
		return nil, fatalf("ENABLE_IPv6=true: instance type %s does not support prefix delegation, and IPv6 pods take their addresses from a /80 prefix on the primary ENI; use a Nitro-based or bare-metal type, or run with ENABLE_IPv6=false",
			self.Type)
	}
	a, ok := r.prov.(provider.IPv6Assigner)
	if !ok {
		return nil, fatalf("ENABLE_IPv6=true: the cloud provider %T cannot assign IPv6 prefixes", r.prov)
	}
	added, err := a.AssignIPv6(ctx, self.PrimaryENI, 1, true)
	if err != nil {
		return nil, fmt.Errorf("ENABLE_IPv6=true: assigning an IPv6 /80 prefix to the primary ENI %s in subnet %s: %w", self.PrimaryENI, self.SubnetID, err)
	}
	var got []netip.Prefix
	for _, p := range added {
		if p.Addr().Is6() && p.Bits() == 80 {
			got = append(got, p)
		}
	}
	if len(got) == 0 {
		return nil, fmt.Errorf("ENABLE_IPv6=true: EC2 assigned %v to the primary ENI %s, not a /80 prefix", added, self.PrimaryENI)
	}
	r.log.Info("IPv6 mode: assigned a /80 to the primary ENI", "eni", self.PrimaryENI, "prefix", got[0])
	e := enis[i]
	e.IPv6Prefixes = append(slices.Clone(e.IPv6Prefixes), got...)
	slices.SortFunc(e.IPv6Prefixes, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	out := slices.Clone(enis)
	out[i] = e
	return out, nil
}
