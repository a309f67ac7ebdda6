// Package api is the wire protocol between the vpcip-cni plugin and the vpcipd
// daemon: versioned JSON request and response types sent over HTTP on the
// daemon's unix socket (default /run/vpcip/ipamd.sock), and a small client.
//
// It imports the standard library only, so the plugin stays small and fast to
// start, and an operator can reach the daemon with
// `curl --unix-socket /run/vpcip/ipamd.sock http://vpcipd/v1/status`.
//
// Endpoints (all JSON bodies):
//
//	POST /v1/assign      AssignRequest  → Assignment
//	POST /v1/release     ReleaseRequest → ReleaseResponse
//	POST /v1/check       CheckRequest   → Assignment
//	POST /v1/gc          GCRequest      → GCResponse
//	POST /v1/gc/plan     GCRequest      → GCResponse (lists, releases nothing)
//	POST /v1/gc/release  GCRequest      → GCResponse (releases GCRequest.Release)
//	GET  /v1/status                     → Status
//
// A failed call answers a non-2xx status with an Error body whose Code is
// machine-readable: 400 CodeInvalid, 404 CodeNotFound, 503 CodeNoAddress or
// CodeNotReady (retryable), 500 CodeInternal.
package api

import (
	"fmt"
	"net/netip"
	"time"
)

// Version is the protocol version carried in every request and response.
const Version = "v1"

// Key identifies one attachment, the CNI spec's (network name, container ID,
// ifname) triple. The daemon keys every assignment by it; pod names are
// metadata only.
type Key struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

func (k Key) String() string { return k.Network + "/" + k.ContainerID + "/" + k.IfName }

// Key field bounds, in bytes: well above what runtimes send (64-hex sandbox
// IDs, short network names), so one request cannot grow the checkpoint by
// megabytes; an interface name is the kernel's IFNAMSIZ − 1.
const (
	MaxKeyField = 256
	MaxIfName   = 15
)

// KeyError is Key.Check's refusal: Field ("network", "containerID" or
// "ifName") is missing or too long.
type KeyError struct {
	Field string
	Key   Key
	Msg   string
}

func (e *KeyError) Error() string {
	return "attachment key " + e.Key.String() + ": " + e.Field + " " + e.Msg
}

// Check reports a Key the daemon refuses (a *KeyError): a field missing, a
// network name or container ID over MaxKeyField bytes, an interface name
// over MaxIfName. Such a key can hold no address.
func (k Key) Check() error {
	for _, f := range []struct {
		name, v string
		max     int
	}{{"network", k.Network, MaxKeyField}, {"containerID", k.ContainerID, MaxKeyField}, {"ifName", k.IfName, MaxIfName}} {
		switch {
		case f.v == "":
			return &KeyError{Field: f.name, Key: k, Msg: "is required"}
		case len(f.v) > f.max:
			return &KeyError{Field: f.name, Key: Key{Network: trunc(k.Network), ContainerID: trunc(k.ContainerID), IfName: trunc(k.IfName)},
				Msg: fmt.Sprintf("is %d bytes, more than %d", len(f.v), f.max)}
		}
	}
	return nil
}

// trunc shortens s for an error message.
func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Pod is the Kubernetes pod an attachment belongs to, from CNI_ARGS.
type Pod struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	UID       string `json:"uid,omitempty"`
}

// MaxPodField bounds each Pod field, in bytes: Kubernetes' longest name (a
// DNS subdomain, 253); a namespace (63) and a UID (36) are shorter.
const MaxPodField = 253

// Check refuses a Pod with a field over MaxPodField bytes: no Kubernetes
// object has one, and the daemon records Pod in its checkpoint.
func (p Pod) Check() error {
	for _, f := range []struct{ name, v string }{{"namespace", p.Namespace}, {"name", p.Name}, {"uid", p.UID}} {
		if len(f.v) > MaxPodField {
			return fmt.Errorf("pod %s is %d bytes, more than %d (Kubernetes: a DNS subdomain)", f.name, len(f.v), MaxPodField)
		}
	}
	return nil
}

// AssignRequest asks for a pod address. Asking twice with the same Key gets
// the same Assignment (idempotent ADD).
type AssignRequest struct {
	Version string `json:"version"`
	Key     Key    `json:"key"`
	Pod     Pod    `json:"pod"`
	Netns   string `json:"netns,omitempty"`
	// Deadline is when the caller stops waiting for the answer (wall
	// clock; zero: none). The daemon waits for an address no longer, and
	// an address it would hand out later is not assigned (or is undone):
	// nothing would hold it, as the plugin has given up and its runtime's
	// DEL may already have come. Client.Assign sets it from the context's
	// deadline, a little before it.
	Deadline time.Time `json:"deadline,omitzero"`
}

// Assignment is an address held by one Key, with what the plugin needs to wire
// the datapath.
type Assignment struct {
	Version      string         `json:"version"`
	Key          Key            `json:"key"`
	Pod          Pod            `json:"pod"`
	Address      netip.Addr     `json:"address"`      // the pod's IPv4 address (used as /32), or in IPv6 mode its IPv6 address (used as /128, RouteTable 0): the plugin wires the family of this address
	ENIID        string         `json:"eniID"`        // ENI the address lives on
	DeviceNumber int            `json:"deviceNumber"` // that ENI's device number; 0 is the primary ENI
	RouteTable   int            `json:"routeTable"`   // 0: main table (primary ENI); else routing.TableForDevice(DeviceNumber)
	SubnetCIDR   netip.Prefix   `json:"subnetCIDR"`   // the ENI subnet's CIDR of Address's family (IPv6: the subnet's /64)
	VPCCIDRs     []netip.Prefix `json:"vpcCIDRs"`     // the VPC's CIDRs of Address's family (IPv6: its /56s)
	MTU          int            `json:"mtu"`          // bytes
	AssignedAt   time.Time      `json:"assignedAt"`
}

// ReleaseRequest gives an address back by Key. Releasing an unknown Key is
// success with Released false (idempotent DEL).
type ReleaseRequest struct {
	Version string `json:"version"`
	Key     Key    `json:"key"`
	// HostVeth is the host veth name the plugin derives for the attachment.
	// After a lost checkpoint the daemon re-holds live pods' addresses from
	// their host routes under placeholder keys; it matches such an
	// assignment to this Key by the veth. Optional.
	HostVeth string `json:"hostVeth,omitempty"`
}

// ReleaseResponse says what was released. Assignment is nil when the Key held
// nothing.
type ReleaseResponse struct {
	Version    string      `json:"version"`
	Released   bool        `json:"released"`
	Assignment *Assignment `json:"assignment,omitempty"`
}

// CheckRequest asks whether the daemon still holds the Key's assignment
// (CNI CHECK; DEL asks it too, to remove the address's host state while the
// key still holds it, before its ReleaseRequest). Unknown keys answer
// CodeNotFound.
type CheckRequest struct {
	Version  string `json:"version"`
	Key      Key    `json:"key"`
	Pod      Pod    `json:"pod"`                // from CNI_ARGS, recorded when a recovered assignment is adopted
	HostVeth string `json:"hostVeth,omitempty"` // as in ReleaseRequest
}

// GCRequest carries the runtime's valid attachments for one network
// (CNI spec 1.1 §GC, cni.dev/valid-attachments). An assignment of that
// network not listed and older than the daemon's grace period
// (VPCIP_GC_GRACE) is stale.
//
// A GC takes two steps, so that a released address keeps nothing in the
// node netns that could catch the traffic of the next pod given it (B13):
// /v1/gc/plan lists the stale assignments and releases nothing; the plugin
// removes the host veth, route and policy rules of each while its key
// still holds the address (no other pod can have it yet); /v1/gc/release
// then releases those whose removal succeeded, named in Release. The rest
// stay held, and stale, for the next GC.
//
// /v1/gc releases every stale assignment at once (the one step of plugins
// that predate the plan; Release is ignored). The plan has a path of its
// own rather than a dry-run field in /v1/gc: an older daemon ignores
// unknown fields and would release at once, while it answers an unknown
// path 404 (see ErrNoEndpoint) and releases nothing. A plugin that gets
// that answer falls back to the one-step /v1/gc, the order of before.
type GCRequest struct {
	Version string `json:"version"`
	Network string `json:"network"`
	Valid   []Key  `json:"valid"`
	// Release (for /v1/gc/release only) names the stale assignments to
	// release, each by key and the address the plan gave it: one whose key
	// holds another address now, or that is no longer stale, is left
	// alone. Empty: nothing is released.
	Release []GCTarget `json:"release,omitempty"`
}

// GCTarget is one assignment a /v1/gc/release names: a key and the
// address a /v1/gc/plan said it held.
type GCTarget struct {
	Key     Key        `json:"key"`
	Address netip.Addr `json:"address"`
}

// GCResponse lists the assignments a GC released (/v1/gc, /v1/gc/release)
// or would release now (/v1/gc/plan), by address.
type GCResponse struct {
	Version  string       `json:"version"`
	Released []Assignment `json:"released"`
}

// Status is the daemon's readiness and pool counts. Its JSON keeps the
// counts at the top level ("assigned", "warm", ..., "maxENIs"), as before
// Counts existed.
type Status struct {
	Version string `json:"version"`
	Ready   bool   `json:"ready"`
	Reason  string `json:"reason,omitempty"` // why not ready, or a degradation ("subnet exhausted")
	Counts
}

// Code is a machine-readable error class.
type Code string

const (
	// CodeNoAddress: no address is free now; the Cause says why (node at its
	// ENI limit, subnet full, throttled, waiting for the cloud). Retryable:
	// the plugin answers CNI error 11 (try again later).
	CodeNoAddress Code = "no-address"
	// CodeNotReady: the daemon has not finished restoring its state.
	CodeNotReady Code = "not-ready"
	// CodeNotFound: the Key holds no assignment (CHECK only).
	CodeNotFound Code = "not-found"
	// CodeInvalid: the request is malformed or of an unknown version.
	CodeInvalid Code = "invalid-request"
	// CodeInternal: anything else.
	CodeInternal Code = "internal"
)

// Cause refines CodeNoAddress.
type Cause string

const (
	CauseENILimit     Cause = "eni-limit"         // node at its ENI limit and every address assigned
	CauseSubnetFull   Cause = "subnet-full"       // the subnet has no free address
	CauseThrottled    Cause = "throttled"         // the cloud API is throttling the daemon
	CauseWaitingCloud Cause = "waiting-for-cloud" // a pool refill is in flight
	CauseMaxPods      Cause = "max-pods"          // the node holds its maximum number of pods
	// CauseNoPrefix: prefix mode, and the subnet has free addresses but no
	// aligned free /28 (EC2 InsufficientCidrBlocks, fragmentation).
	CauseNoPrefix Cause = "no-contiguous-prefix"
	// CauseCooldown: every free address was released less than
	// IP_COOLDOWN_PERIOD ago and the pool cannot grow.
	CauseCooldown Cause = "cooldown"
)

// Error is the body of every non-2xx answer.
type Error struct {
	Version string `json:"version"`
	Code    Code   `json:"code"`
	Cause   Cause  `json:"cause,omitempty"`
	Message string `json:"message"` // human-readable, complete: it ends up in kubelet events
}

func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("vpcipd: %s %s", e.Code, e.Cause)
}

// Retryable reports whether the plugin should answer "try again later".
func (e *Error) Retryable() bool { return e.Code == CodeNoAddress || e.Code == CodeNotReady }
