// Package provider is the cloud seam of vpcip: a small, cloud-neutral view of
// the instance the daemon runs on, the ENIs attached to it and the addresses
// and /28 prefixes those ENIs hold.
//
// The daemon (ipamd) speaks only these types; SDK structs never leave the
// backend packages (provider/aws). Every backend classifies its cloud's error
// codes into the sentinel errors below, so callers use errors.Is and never
// match error text. The package imports the standard library only.
package provider

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Sentinel errors. A backend wraps its cloud error with one of these so that
// errors.Is(err, provider.ErrThrottled) and friends hold; the wrapped message
// keeps the cloud's own code and text for logs.
var (
	// ErrThrottled: the cloud refused the call for request rate
	// (EC2 RequestLimitExceeded). Retry later with backoff.
	ErrThrottled = errors.New("cloud API throttled")
	// ErrAddressLimit: the ENI already holds as many addresses or prefixes
	// as its instance type allows (EC2 PrivateIpAddressLimitExceeded).
	ErrAddressLimit = errors.New("ENI address limit reached")
	// ErrENILimit: the instance already has as many ENIs attached as its
	// type allows (EC2 AttachmentLimitExceeded).
	ErrENILimit = errors.New("instance ENI limit reached")
	// ErrSubnetFull: the subnet has no free address left
	// (EC2 InsufficientFreeAddressesInSubnet).
	ErrSubnetFull = errors.New("subnet has no free addresses")
	// ErrInsufficientCIDR: the subnet has free addresses but no aligned free
	// /28 for a prefix (EC2 InsufficientCidrBlocks: fragmentation).
	ErrInsufficientCIDR = errors.New("subnet has no free aligned /28 prefix")
	// ErrNotFound: the named ENI, instance or subnet does not exist
	// (EC2 InvalidNetworkInterfaceID.NotFound, InvalidInstanceID.NotFound, ...).
	ErrNotFound = errors.New("cloud resource not found")
	// ErrUnauthorized: the caller's credentials do not allow the call
	// (EC2 UnauthorizedOperation).
	ErrUnauthorized = errors.New("cloud call not authorized")
	// ErrAddressInUse: an address asked for by name is held by another ENI
	// (EC2 InvalidIPAddress.InUse). EC2 also refuses such a request with
	// InvalidParameterValue ("Address ... is in use"), which stays
	// unclassified: callers that name addresses fall back on any refusal.
	ErrAddressInUse = errors.New("address already in use")
	// ErrNotVisible: the cloud made the change (an ENI attached, addresses
	// assigned), but instance metadata did not show it within the backend's
	// wait bound. The change stands and the method also returns what it made;
	// keep it, but hand addresses out only once metadata or the
	// authoritative API shows them.
	ErrNotVisible = errors.New("change not yet visible in instance metadata")
)

// Instance describes the instance the daemon runs on, as instance metadata
// (IMDS) reports it.
type Instance struct {
	ID               string         // e.g. "i-0123456789abcdef0"
	Type             string         // e.g. "m5.large"
	Region           string         // e.g. "us-west-2"
	AvailabilityZone string         // e.g. "us-west-2a"
	VPCID            string         // e.g. "vpc-0123..."
	VPCCIDRs         []netip.Prefix // primary and secondary IPv4 CIDRs of the VPC
	PrimaryENI       string         // ENI id at device number 0
	PrimaryMAC       string         // lower-case "0a:1b:..." MAC of the primary ENI
	PrimaryIP        netip.Addr     // primary private IPv4 of the primary ENI
	SubnetID         string         // subnet of the primary ENI
	SecurityGroups   []string       // security group ids of the primary ENI
	// SubnetIPv6CIDR is the IPv6 CIDR block (a /64) of the primary ENI's
	// subnet; invalid when the subnet has none (IMDS
	// subnet-ipv6-cidr-blocks).
	SubnetIPv6CIDR netip.Prefix
	// VPCIPv6CIDRs are the VPC's IPv6 CIDR blocks (/56s); none when it has
	// none (IMDS vpc-ipv6-cidr-blocks).
	VPCIPv6CIDRs []netip.Prefix
}

// Limits are the network limits of an instance type (EC2 DescribeInstanceTypes
// NetworkInfo). Only the default network card's ENIs count, as pods use only it.
type Limits struct {
	MaxENIs          int  // ENIs attachable on the default network card
	IPv4PerENI       int  // IPv4 addresses per ENI, the ENI's primary address included
	PrefixDelegation bool // /28 prefixes may be assigned (Nitro or bare metal)
	Hypervisor       string
	BareMetal        bool
}

// PodAddressesPerENI is how many addresses (or, in prefix mode, /28 prefix
// slots) one ENI can give to pods: IPv4PerENI minus the ENI's own primary.
func (l Limits) PodAddressesPerENI() int {
	if l.IPv4PerENI < 1 {
		return 0
	}
	return l.IPv4PerENI - 1
}

// PodENIs is how many of the instance's ENIs hold pod addresses: MaxENIs,
// capped by maxENI when maxENI > 0 (MAX_ENI), minus one under custom
// networking, where the primary ENI holds none (AWS VPC CNI issue #331,
// field failure B19). The daemon's pool limits and `vpcipctl max-pods` both
// use it, so the node's budget and kubelet's max-pods agree.
func (l Limits) PodENIs(maxENI int, customNetworking bool) int {
	n := l.MaxENIs
	if maxENI > 0 && maxENI < n {
		n = maxENI
	}
	if customNetworking {
		n--
	}
	return max(n, 0)
}

// MaxPods is the reference formula ENIs × (IPv4 per ENI − 1) + 2 (the two are
// host-network pods), in pods.
func (l Limits) MaxPods() int { return l.MaxENIs*l.PodAddressesPerENI() + 2 }

// ENI is one elastic network interface attached to the instance.
type ENI struct {
	ID             string         // "eni-" + 17 hex digits
	MAC            string         // lower-case, colon-separated
	DeviceNumber   int            // attachment device index; 0 is the primary ENI
	NetworkCard    int            // network card index; pods use card 0
	SubnetID       string         //
	SubnetCIDR     netip.Prefix   // IPv4 CIDR of the ENI's subnet
	Gateway        netip.Addr     // subnet gateway: the subnet's first address + 1
	PrimaryIP      netip.Addr     // the ENI's primary private address (never a pod address)
	SecondaryIPs   []netip.Addr   // secondary private addresses, sorted
	Prefixes       []netip.Prefix // delegated /28 prefixes, sorted
	IPv6Prefixes   []netip.Prefix // delegated IPv6 /80 prefixes, sorted (IPv6Assigner)
	SecurityGroups []string       //
	Tags           map[string]string
	Attached       time.Time // when the attachment was made; zero if unknown
}

// Subnet is a VPC subnet.
type Subnet struct {
	ID               string
	VPCID            string
	CIDR             netip.Prefix
	AvailabilityZone string
	FreeAddresses    int               // EC2 AvailableIpAddressCount, in addresses
	Tags             map[string]string // never nil
	// FreePrefixes is how many aligned /28s hold no address and none of
	// the five AWS reserves (what EC2 can still delegate as prefixes). Not
	// set by Provider.Subnets (DescribeSubnets has no such count):
	// fleetmetrics.Subnets.Latest sets it from its DescribeNetworkInterfaces
	// by subnet-id; nil: not read.
	FreePrefixes *int
}

// SubnetQuery selects subnets for Provider.Subnets. IDs and Zone combine:
// with both, only the named subnets in that zone.
type SubnetQuery struct {
	IDs  []string // these subnets; one that does not exist is ErrNotFound
	Zone string   // subnets of this instance's VPC in this availability zone; "" = any zone
}

// CreateENIRequest asks for a new ENI attached to this instance at the next
// free device number, with its addresses or prefixes assigned in the same
// EC2 call (CreateNetworkInterface with SecondaryPrivateIpAddressCount or
// Ipv4PrefixCount). At most one of Addresses and Prefixes is non-zero.
type CreateENIRequest struct {
	SubnetID       string            // empty: the primary ENI's subnet
	SecurityGroups []string          // empty: the primary ENI's groups
	Addresses      int               // secondary IPv4 addresses to assign
	Prefixes       int               // /28 prefixes to assign
	Tags           map[string]string // extra tags; the backend adds node, cluster and creation-time tags
}

// Provider is the daemon's view of the cloud. Implementations are safe for
// concurrent use, but the daemon calls the mutating methods from one goroutine.
type Provider interface {
	// Self describes this instance from instance metadata.
	Self(ctx context.Context) (Instance, error)
	// Limits returns the network limits of an instance type, from a built-in
	// table or the cloud's DescribeInstanceTypes; results are cached.
	Limits(ctx context.Context, instanceType string) (Limits, error)
	// ENIs lists the ENIs attached to this instance on network card 0, with
	// their addresses and prefixes, from the authoritative API
	// (EC2 DescribeNetworkInterfaces filtered by attachment.instance-id).
	ENIs(ctx context.Context) ([]ENI, error)
	// MetadataENIs lists the same from instance metadata: cheap and not
	// rate-limited, but eventually consistent. Never act destructively on it
	// alone.
	MetadataENIs(ctx context.Context) ([]ENI, error)
	// CreateENI creates an ENI with its addresses or prefixes, attaches it at
	// the next free device number with delete-on-termination set, and returns
	// it once instance metadata shows it. A failed attach deletes the new ENI.
	CreateENI(ctx context.Context, req CreateENIRequest) (ENI, error)
	// AssignAddresses adds n secondary addresses (prefix false) or n /28
	// prefixes (prefix true) to an ENI (EC2 AssignPrivateIpAddresses) and
	// returns what was added, as /32 or /28 prefixes, once metadata shows it.
	AssignAddresses(ctx context.Context, eniID string, n int, prefix bool) ([]netip.Prefix, error)
	// AssignAddressesAt adds the named secondary addresses to an ENI (EC2
	// AssignPrivateIpAddresses with PrivateIpAddresses) and returns them as
	// /32 prefixes, sorted, once metadata shows them. Nothing is assigned
	// when EC2 refuses one of them (held by another ENI: ErrAddressInUse or
	// an unclassified InvalidParameterValue). A backend that cannot name
	// addresses returns an error wrapping errors.ErrUnsupported.
	AssignAddressesAt(ctx context.Context, eniID string, addrs []netip.Addr) ([]netip.Prefix, error)
	// SubnetUsage lists what every ENI in a subnet holds: primary and
	// secondary addresses as /32s and delegated /28 prefixes, sorted (EC2
	// DescribeNetworkInterfaces filtered by subnet-id, every page; one call
	// per page against the describe budget). A backend that cannot list a
	// subnet returns an error wrapping errors.ErrUnsupported.
	SubnetUsage(ctx context.Context, subnetID string) ([]netip.Prefix, error)
	// UnassignAddresses removes the given /32 addresses and /28 prefixes from
	// an ENI (EC2 UnassignPrivateIpAddresses).
	UnassignAddresses(ctx context.Context, eniID string, addrs []netip.Prefix) error
	// DeleteENI detaches and deletes an ENI. An ENI already gone is success.
	DeleteENI(ctx context.Context, eniID string) error
	// Subnets lists subnets with their tags and free address counts, fresh
	// from the authoritative API (EC2 DescribeSubnets, every page), sorted by
	// ID. With no IDs it lists only this instance's VPC.
	Subnets(ctx context.Context, q SubnetQuery) ([]Subnet, error)
	// DeleteLeakedENIs deletes ENIs tagged as created by this cluster that are
	// `available` (not attached) and older than grace, and returns their ids.
	DeleteLeakedENIs(ctx context.Context, grace time.Duration) ([]string, error)
}

// IPv6Assigner is the IPv6 side of a backend, for a Provider that also
// implements it: IPv6 addresses and /80 prefixes from the subnet's IPv6 CIDR
// block (a /64) on an ENI. EC2 delegates /80 prefixes on Nitro and
// bare-metal types only, and counts each /80 as one of the type's "IPv6
// addresses per interface".
type IPv6Assigner interface {
	// AssignIPv6 adds n IPv6 addresses (prefix false) or n /80 prefixes
	// (prefix true) to an ENI (EC2 AssignIpv6Addresses with
	// Ipv6AddressCount or Ipv6PrefixCount) and returns what was added, as
	// /128s or /80s, sorted, once the cloud answers; it does not wait for
	// instance metadata. Refusals: ErrNotFound (no such ENI),
	// ErrInsufficientCIDR (no free /80), ErrUnauthorized, ErrThrottled; a
	// subnet without an IPv6 CIDR block, a type without IPv6 or without
	// prefix delegation and the per-ENI limit come back unclassified (EC2
	// answers them all with InvalidParameterValue).
	AssignIPv6(ctx context.Context, eniID string, n int, prefix bool) ([]netip.Prefix, error)
	// UnassignIPv6 removes /128 addresses and /80 prefixes from an ENI (EC2
	// UnassignIpv6Addresses, one call). An empty list does nothing; anything
	// else than an IPv6 /128 or aligned /80 is refused before calling EC2.
	UnassignIPv6(ctx context.Context, eniID string, addrs []netip.Prefix) error
}

// CallObserver receives one report per cloud call: the operation name
// (e.g. "AssignPrivateIpAddresses", "imds"), the outcome ("ok", "throttled",
// "error", or the sentinel's short name) and the latency including retries.
// The daemon turns it into metrics.
type CallObserver func(operation, outcome string, latency time.Duration)

// Priority orders a node's cloud calls when the fleet shares one request
// budget (RequestBudget): a call may spend the shared budget only down to
// its priority's reserve, so when the budget runs short, calls that unblock
// a waiting pod go first and refills, releases and clean-up wait.
type Priority int

// Priorities, lowest first.
const (
	// PriorityBackground: describes, leaked-ENI clean-up.
	PriorityBackground Priority = iota
	// PriorityRelease: giving surplus back (unassign, detach, delete).
	PriorityRelease
	// PriorityRefill: growing the warm pool while no pod waits.
	PriorityRefill
	// PriorityPodWaiting: growing the pool while a pod waits for an
	// address (a CNI ADD waiting, or a pod bound to the node without one).
	PriorityPodWaiting
)

func (p Priority) String() string {
	switch p {
	case PriorityBackground:
		return "background"
	case PriorityRelease:
		return "release"
	case PriorityRefill:
		return "refill"
	case PriorityPodWaiting:
		return "pod-waiting"
	}
	return "unknown"
}

type priorityKey struct{}

// WithPriority returns ctx carrying p for the cloud calls made under it.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityOf returns the priority ctx carries, and whether it carries one.
func PriorityOf(ctx context.Context) (Priority, bool) {
	p, ok := ctx.Value(priorityKey{}).(Priority)
	return p, ok
}

// RequestBudget is a cloud request budget shared by the nodes of a fleet
// (EC2 meters requests per account and region, whatever node makes them).
// A backend takes one request from it before every attempt of a call it
// meters, retries included, and reports every refusal for rate. It must be
// safe for concurrent use.
type RequestBudget interface {
	// Take returns when one request of action (an EC2 action name such as
	// "AttachNetworkInterface") may be made at priority p, or with ctx's
	// error when ctx ends first.
	Take(ctx context.Context, action string, p Priority) error
	// Refused reports that the cloud refused a request of action for rate
	// (EC2 RequestLimitExceeded) although the budget allowed it.
	Refused(action string)
}

// RequestReserver is a RequestBudget that can hold a request's place in
// its queue without waiting for it there: Reserve takes one request of
// action at p as Take does and returns at once how long until it may be
// made (0: now). Take is Reserve followed by a sleep of that long. Errors
// as Take's (a *BudgetShortError when p finds no room, nothing taken).
type RequestReserver interface {
	RequestBudget
	Reserve(ctx context.Context, action string, p Priority) (wait time.Duration, err error)
}

type deferralKey struct{}

// WithDeferral marks the cloud calls made under ctx as ones the caller can
// come back to: when the fleet's shared budget (a RequestReserver) would
// hold such a call in its queue for DeferAfter or longer, the backend keeps
// the call's place (a ticket), sends nothing and returns a *DeferredError;
// the same action called again once the ticket is due goes without taking
// another request. A caller that plans several calls (the warm pool) thus
// queues its next one while the first still waits its turn, instead of
// sleeping inside it.
func WithDeferral(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferralKey{}, true)
}

// WithoutDeferral is ctx with WithDeferral undone, for the calls a backend
// makes on its own under a caller's ctx and cannot come back to (a
// DeferredError there would be dropped, its place held for nothing).
func WithoutDeferral(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferralKey{}, false)
}

// Deferrable reports whether ctx carries WithDeferral (and no later
// WithoutDeferral).
func Deferrable(ctx context.Context) bool { v, _ := ctx.Value(deferralKey{}).(bool); return v }

// DeferAfter is the shortest queue wait in the shared budget for which a
// deferrable call returns a DeferredError instead of sleeping: shorter
// waits cost less than a second plan.
const DeferAfter = time.Second

// DeferredError is returned, without any request sent, by a call made under
// WithDeferral whose place in the fleet's shared request budget is held
// until Until: calling the same action again at or after Until makes the
// request without taking another one from the budget.
type DeferredError struct {
	Action string    // e.g. "CreateNetworkInterface"
	Until  time.Time // when the held request may be made
}

func (e *DeferredError) Error() string {
	return fmt.Sprintf("%s deferred: its place in the fleet's shared request budget is held until %s", e.Action, e.Until.Format(time.RFC3339Nano))
}

// BudgetShortError is returned, without any request sent, when a fleet's
// shared request budget (RequestBudget) has no room for a call at its
// priority now. errors.Is(err, ErrThrottled) holds. Wait is when the budget
// expects room for it, if no other node takes any meanwhile.
type BudgetShortError struct {
	Action   string // e.g. "AttachNetworkInterface"
	Priority Priority
	Wait     time.Duration
}

func (e *BudgetShortError) Error() string {
	return fmt.Sprintf("%s at priority %s: the fleet's shared request budget has no room now (expected in %s)", e.Action, e.Priority, e.Wait.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrThrottled) hold.
func (e *BudgetShortError) Is(target error) bool { return target == ErrThrottled }
