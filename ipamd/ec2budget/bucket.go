// Package ec2budget shares one account's EC2 request budget among the
// vpcipd daemons of a cluster without a central allocator (docs/design.md
// §9). EC2 meters requests per account and region with one token bucket per
// action; every node draws on the same buckets. For each mutating action
// the daemons make, coordination.k8s.io Leases in the daemon's namespace
// (vpcip-ec2-<action>-<k>, Options.Shards of them, each holding that share of
// the bucket) hold the fleet's view of that bucket in an annotation:
// capacity, refill rate, tokens and when they were counted. A daemon takes a
// request by optimistic concurrency (read its home shard's Lease, refill its
// tokens for the time passed, take one, write it back under the read
// resourceVersion; a conflict means another node took one meanwhile, so
// read again) and makes the EC2 request only once it holds the token. When
// the home shard would make the call wait, a second shard at random serves
// it if that one is shorter.
//
// Priorities need no scheduler: a call may take a token only while the
// bucket stays above its priority's reserve (Reserve). A call that unblocks
// a waiting pod may go below zero, down to MaxDebt (QueueSpan of refill, at
// least one bucket): it then holds a reservation and waits until the refill
// has paid it, so those calls are served in the order they were taken, at
// the account's rate.
// Other calls are refused at once with provider.BudgetShortError, telling
// when the bucket should have room for them, so the daemon's worker is not
// held while a pod may arrive.
//
// A refusal from EC2 (RequestLimitExceeded) while the fleet believed it had
// room (the account's other callers, a stale share) empties the shared
// bucket, so the whole fleet backs off at once. When the API server cannot
// be reached (or times out), a daemon calls EC2 under its local limits
// alone for a while (Options.Degraded), as without a shared budget.
package ec2budget

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// Limit is one EC2 account bucket: Capacity requests, refilled at
// RefillPerSecond requests a second.
type Limit struct {
	Capacity        float64
	RefillPerSecond float64
}

// AWSLimits are AWS's documented default bucket sizes and refill rates for
// the mutating actions vpcipd makes ("Request throttling for the Amazon EC2
// API", docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html:
// Attach/DetachNetworkInterface are "mutating actions", 50 tokens and 5 a
// second; the others "uncategorized", 100 tokens and 5 a second). Describes
// are not shared: each daemon paces them locally.
func AWSLimits() map[string]Limit {
	uncategorized := Limit{Capacity: 100, RefillPerSecond: 5}
	mutating := Limit{Capacity: 50, RefillPerSecond: 5}
	return map[string]Limit{
		"AssignPrivateIpAddresses":        uncategorized,
		"UnassignPrivateIpAddresses":      uncategorized,
		"CreateNetworkInterface":          uncategorized,
		"DeleteNetworkInterface":          uncategorized,
		"ModifyNetworkInterfaceAttribute": uncategorized,
		"AttachNetworkInterface":          mutating,
		"DetachNetworkInterface":          mutating,
	}
}

// Reserve is the fraction of the bucket's capacity a call of priority p
// must leave: a pod-waiting call may spend it all (and go into debt), a
// warm-pool refill only above a quarter, a release above half, background
// work above three quarters.
func Reserve(p provider.Priority) float64 {
	switch p {
	case provider.PriorityPodWaiting:
		return 0
	case provider.PriorityRefill:
		return 0.25
	case provider.PriorityRelease:
		return 0.5
	}
	return 0.75
}

// QueueSpan is how far ahead pod-waiting calls may reserve: the debt
// allowed is this much of the refill (MaxDebt). A call past it is refused
// and polls, so the bound is set above what a launch of hundreds of nodes
// queues (200 nodes' second ENIs at 5 attaches a second: 40 s), and low
// enough that a reservation is not kept for a pod long gone.
const QueueSpan = time.Minute

// MaxDebt is how far below zero pod-waiting calls may take l's bucket:
// QueueSpan of its refill, at least its capacity.
func MaxDebt(l Limit) float64 { return math.Max(l.Capacity, l.RefillPerSecond*QueueSpan.Seconds()) }

// State is the fleet's view of one account bucket, as stored in the Lease's
// annotation (JSON). Tokens may be negative: requests reserved by pod-waiting
// calls that the refill has not yet paid.
type State struct {
	Capacity        float64   `json:"capacity"`
	RefillPerSecond float64   `json:"refillPerSecond"`
	Tokens          float64   `json:"tokens"`
	At              time.Time `json:"at"` // when Tokens was counted
}

// Full is a full bucket of l at now.
func Full(l Limit, now time.Time) State {
	return State{Capacity: l.Capacity, RefillPerSecond: l.RefillPerSecond, Tokens: l.Capacity, At: now}
}

// refilled is s at now: capacity and rate from l (the writer's figures
// win, so a changed configuration takes over), tokens refilled for the
// time since s.At, up to the capacity. A clock behind s.At refills nothing.
func (s State) refilled(l Limit, now time.Time) State {
	out := State{Capacity: l.Capacity, RefillPerSecond: l.RefillPerSecond, Tokens: s.Tokens, At: s.At}
	if now.After(s.At) {
		out.Tokens = math.Min(l.Capacity, s.Tokens+now.Sub(s.At).Seconds()*l.RefillPerSecond)
		out.At = now
	}
	out.Tokens = math.Min(out.Tokens, l.Capacity)
	return out
}

// Take takes one request for a call of priority p from s at now, with l's
// figures. ok: next is the state to write back, and the request may be
// made after wait (non-zero only for a pod-waiting call that went into
// debt: the time until the refill has paid for it). Not ok: nothing is
// taken and wait is how long until the bucket holds enough above p's
// reserve, if nobody else takes meanwhile.
func (s State) Take(l Limit, now time.Time, p provider.Priority) (next State, wait time.Duration, ok bool) {
	if l.RefillPerSecond <= 0 || l.Capacity < 1 {
		return s, 0, false
	}
	cur := s.refilled(l, now)
	floor := Reserve(p) * l.Capacity
	if p == provider.PriorityPodWaiting {
		floor = -MaxDebt(l)
	}
	after := cur.Tokens - 1
	if after < floor {
		return cur, seconds((floor + 1 - cur.Tokens) / l.RefillPerSecond), false
	}
	cur.Tokens = after
	if after < 0 {
		wait = seconds(-after / l.RefillPerSecond)
	}
	return cur, wait, true
}

// Refused is s after EC2 refused a request at now although the fleet
// believed it had room: no tokens left (reservations already made stay).
func (s State) Refused(l Limit, now time.Time) State {
	cur := s.refilled(l, now)
	cur.Tokens = math.Min(cur.Tokens, 0)
	return cur
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Encode is s as the annotation stores it.
func (s State) Encode() string {
	b, _ := json.Marshal(s) // floats and a time: cannot fail
	return string(b)
}

// Decode reads an annotation written by Encode.
func Decode(v string) (State, error) {
	var s State
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return State{}, fmt.Errorf("EC2 budget annotation %q: %w", v, err)
	}
	if math.IsNaN(s.Tokens) || math.IsInf(s.Tokens, 0) || s.At.IsZero() {
		return State{}, fmt.Errorf("EC2 budget annotation %q: tokens or time missing", v)
	}
	return s, nil
}
