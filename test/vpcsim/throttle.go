package vpcsim

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// BucketLimit is one EC2 request token bucket: it holds at most Capacity
// tokens and gains RefillPerSecond tokens a second; each request takes one.
type BucketLimit struct {
	Capacity        float64 `json:"capacity"`
	RefillPerSecond float64 `json:"refillPerSecond"`
}

// RequestLimits are the account's request token buckets by EC2 action name.
// EC2 evaluates each API action alone ("Limits are applied to individual API
// actions, not API action categories"), so every action has a bucket of its
// own. The key Action+UnfilteredSuffix is the smaller bucket EC2 charges
// for the unfiltered and unpaginated calls of DescribeInstances,
// DescribeNetworkInterfaces and DescribeSecurityGroups (no Filter.N, no
// MaxResults or NextToken). An action without an entry is not limited.
type RequestLimits map[string]BucketLimit

// UnfilteredSuffix marks the unfiltered-and-unpaginated bucket of an action
// in RequestLimits and in RequestCounts' bucket names.
const UnfilteredSuffix = "/unfiltered"

// unfilteredActions are the actions vpcsim serves that EC2 lists among its
// "unfiltered and unpaginated non-mutating actions".
var unfilteredActions = map[string]bool{
	"DescribeInstances":         true,
	"DescribeNetworkInterfaces": true,
	"DescribeSecurityGroups":    true,
}

// AWSRequestLimits returns EC2's documented default request token buckets
// for every action vpcsim serves ("Request throttling for the Amazon EC2
// API", https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html,
// tables "Request token bucket sizes and refill rates"):
//
//	non-mutating actions (Describe*)                     100 tokens, 20/s
//	unfiltered and unpaginated DescribeInstances,
//	  DescribeNetworkInterfaces, DescribeSecurityGroups   50 tokens, 10/s
//	mutating actions (Attach/DetachNetworkInterface)      50 tokens,  5/s
//	Assign/UnassignPrivateIpAddresses, Create/Delete-
//	  NetworkInterface, ModifyNetworkInterfaceAttribute,
//	  TerminateInstances (uncategorized)                 100 tokens,  5/s
//	CreateTags, DeleteTags (uncategorized)               100 tokens, 10/s
//
// TerminateInstances' separate resource bucket (1000 instances, 20/s) is
// not modelled.
func AWSRequestLimits() RequestLimits {
	nonMutating := BucketLimit{Capacity: 100, RefillPerSecond: 20}
	unfiltered := BucketLimit{Capacity: 50, RefillPerSecond: 10}
	mutating := BucketLimit{Capacity: 50, RefillPerSecond: 5}
	uncategorized := BucketLimit{Capacity: 100, RefillPerSecond: 5}
	tags := BucketLimit{Capacity: 100, RefillPerSecond: 10}
	l := RequestLimits{}
	for name := range actions {
		switch {
		case strings.HasPrefix(name, "Describe"):
			l[name] = nonMutating
			if unfilteredActions[name] {
				l[name+UnfilteredSuffix] = unfiltered
			}
		case name == "CreateTags" || name == "DeleteTags":
			l[name] = tags
		case name == "AttachNetworkInterface" || name == "DetachNetworkInterface":
			l[name] = mutating
		default:
			l[name] = uncategorized
		}
	}
	return l
}

// Scaled is l with the capacity and refill rate of every bucket but the
// Describe actions' multiplied by f (capacity at least 1 token): the
// account's mutating buckets as a fleet 1/f times as large sees them from
// its share. Describes keep their buckets (each daemon paces its own; the
// fleet's shared budget does not cover them).
func (l RequestLimits) Scaled(f float64) RequestLimits {
	out := make(RequestLimits, len(l))
	for k, v := range l {
		if !strings.HasPrefix(k, "Describe") {
			v = BucketLimit{Capacity: max(1, v.Capacity*f), RefillPerSecond: v.RefillPerSecond * f}
		}
		out[k] = v
	}
	return out
}

// Validate reports the first entry that names no action vpcsim serves or
// has a capacity below 1 or a refill rate that is not positive.
func (l RequestLimits) Validate() error {
	for _, k := range sortedKeys(l) {
		v := l[k]
		name, unfiltered := strings.CutSuffix(k, UnfilteredSuffix)
		if _, ok := actions[name]; !ok || (unfiltered && !unfilteredActions[name]) {
			return fmt.Errorf("request limit %q: not an EC2 action vpcsim serves (or one without an unfiltered bucket)", k)
		}
		if v.Capacity < 1 || v.RefillPerSecond <= 0 {
			return fmt.Errorf("request limit %q: capacity %v, refill %v/s: want a capacity of at least 1 and a positive refill rate", k, v.Capacity, v.RefillPerSecond)
		}
	}
	return nil
}

// RequestCount counts the requests of one action (or one caller's requests
// of one action): Accepted passed the account's request buckets (and may
// still have failed for another reason), Throttled were refused with
// RequestLimitExceeded.
type RequestCount struct {
	Accepted  int `json:"accepted"`
	Throttled int `json:"throttled"`
}

// accountBuckets are the account's request buckets, their counters and the
// clock. The owning Faults' mutex guards them.
type accountBuckets struct {
	now      func() time.Time
	limits   RequestLimits
	buckets  map[string]*bucket // by RequestLimits key, made on first use
	byAction map[string]RequestCount
	byCaller map[string]map[string]RequestCount // caller address → action → count
}

func (a *accountBuckets) resetCounts() {
	a.byAction = map[string]RequestCount{}
	a.byCaller = map[string]map[string]RequestCount{}
}

// bucketKey is the RequestLimits key a request of action draws from.
func bucketKey(action string, p params) string {
	if !unfilteredActions[action] {
		return action
	}
	for k := range p {
		if strings.HasPrefix(k, "Filter.") || k == "MaxResults" || k == "NextToken" {
			return action
		}
	}
	return action + UnfilteredSuffix
}

// takeLocked takes a token of key's bucket; false when it is empty or has
// no limit configured (true then).
func (a *accountBuckets) takeLocked(key string, now time.Time) bool {
	lim, ok := a.limits[key]
	if !ok {
		return true
	}
	b := a.buckets[key]
	if b == nil {
		b = &bucket{perSecond: lim.RefillPerSecond, burst: lim.Capacity, tokens: lim.Capacity, last: now}
		a.buckets[key] = b
	}
	return b.take(now)
}

func (a *accountBuckets) countLocked(action, caller string, throttled bool) {
	add := func(c RequestCount) RequestCount {
		if throttled {
			c.Throttled++
		} else {
			c.Accepted++
		}
		return c
	}
	a.byAction[action] = add(a.byAction[action])
	m := a.byCaller[caller]
	if m == nil {
		m = map[string]RequestCount{}
		a.byCaller[caller] = m
	}
	m[action] = add(m[action])
}

// SetRequestLimits replaces the account's request token buckets (nil or
// empty: no request-rate limit) and fills every bucket. The class buckets
// of SetThrottle apply on top of these.
func (f *Faults) SetRequestLimits(l RequestLimits) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.account.limits = RequestLimits{}
	for k, v := range l {
		f.account.limits[k] = v
	}
	f.account.buckets = map[string]*bucket{}
}

// RequestLimits returns a copy of the account's request token buckets.
func (f *Faults) RequestLimits() RequestLimits {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := RequestLimits{}
	for k, v := range f.account.limits {
		out[k] = v
	}
	return out
}

// RequestCounts returns, by EC2 action, how many requests the account's
// buckets (those of SetRequestLimits and SetThrottle) accepted and refused.
// Requests of unknown actions or with a bad Version are not counted.
func (f *Faults) RequestCounts() map[string]RequestCount {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]RequestCount, len(f.account.byAction))
	for k, v := range f.account.byAction {
		out[k] = v
	}
	return out
}

// RequestCountsByCaller returns the counts of RequestCounts by the
// caller's IP address (in the netns fabric, an instance's primary address),
// then by action.
func (f *Faults) RequestCountsByCaller() map[string]map[string]RequestCount {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]map[string]RequestCount, len(f.account.byCaller))
	for c, m := range f.account.byCaller {
		cp := make(map[string]RequestCount, len(m))
		for k, v := range m {
			cp[k] = v
		}
		out[c] = cp
	}
	return out
}

// writeMetrics writes the request counters and bucket limits in
// Prometheus' text exposition format (version 0.0.4).
func (f *Faults) writeMetrics(w *strings.Builder) {
	counts, limits := f.RequestCounts(), f.RequestLimits()
	w.WriteString("# HELP vpcsim_ec2_requests_total EC2 API requests by action and outcome of the account's request buckets (accepted or throttled with RequestLimitExceeded).\n")
	w.WriteString("# TYPE vpcsim_ec2_requests_total counter\n")
	for _, a := range sortedKeys(counts) {
		fmt.Fprintf(w, "vpcsim_ec2_requests_total{action=%q,outcome=\"accepted\"} %d\n", a, counts[a].Accepted)
		fmt.Fprintf(w, "vpcsim_ec2_requests_total{action=%q,outcome=\"throttled\"} %d\n", a, counts[a].Throttled)
	}
	w.WriteString("# HELP vpcsim_ec2_bucket_capacity Maximum tokens of the account's request bucket.\n")
	w.WriteString("# TYPE vpcsim_ec2_bucket_capacity gauge\n")
	for _, k := range sortedKeys(limits) {
		fmt.Fprintf(w, "vpcsim_ec2_bucket_capacity{bucket=%q} %g\n", k, limits[k].Capacity)
	}
	w.WriteString("# HELP vpcsim_ec2_bucket_refill_per_second Tokens a second the account's request bucket gains.\n")
	w.WriteString("# TYPE vpcsim_ec2_bucket_refill_per_second gauge\n")
	for _, k := range sortedKeys(limits) {
		fmt.Fprintf(w, "vpcsim_ec2_bucket_refill_per_second{bucket=%q} %g\n", k, limits[k].RefillPerSecond)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
