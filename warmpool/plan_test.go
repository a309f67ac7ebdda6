package warmpool

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// small is the field-failure catalogue's itype-small: 3 ENIs, 10 IPv4 per
// ENI (9 usable slots), no max-pods limit.
var small = Limits{MaxENIs: 3, SlotsPerENI: 9, PrefixSupported: true}

// slots32 returns n /32 slots from first on: the first assigned ones held
// by a pod, the next cooling ones in cooldown, the rest free.
func slots32(first string, n, assigned, cooling int) []Slot {
	a := netip.MustParseAddr(first)
	out := make([]Slot, n)
	for i := range out {
		out[i].Prefix = netip.PrefixFrom(a, 32)
		switch {
		case i < assigned:
			out[i].Assigned = 1
		case i < assigned+cooling:
			out[i].Cooling = 1
		}
		a = a.Next()
	}
	return out
}

// p28 is a /28 slot with assigned and cooling addresses.
func p28(s string, assigned, cooling int) Slot {
	return Slot{Prefix: netip.MustParsePrefix(s), Assigned: assigned, Cooling: cooling}
}

func eni(id string, age time.Duration, slots ...Slot) ENI {
	return ENI{ID: id, Primary: id == "eni-0", Attached: t0.Add(-age), Slots: slots}
}

func pfxs(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

const old = time.Hour

// ruleCase is one row: an input, the plan wanted (Reason aside), a piece of
// text the reason must hold, and why.
type ruleCase struct {
	name      string
	in        Input
	want      Plan
	reasonHas string
	reason    string
}

func runRules(t *testing.T, tests []ruleCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			if in.Now.IsZero() {
				in.Now = t0
			}
			got := Next(in)
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Plan{}, "Reason"), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("%s (-want +got):\n%s\nreason: %s", tt.reason, diff, got.Reason)
			}
			if !strings.Contains(got.Reason, tt.reasonHas) || strings.Contains(got.Reason, "\n") {
				t.Errorf("reason %q: want one line holding %q", got.Reason, tt.reasonHas)
			}
		})
	}
}

func TestGrowthRules(t *testing.T) {
	full := func(id string) ENI { return eni(id, old, slots32("10.0."+id[4:]+".1", 9, 9, 0)...) }
	ipt := func(warm, minimum int) Config { return Config{WarmIPTarget: warm, MinimumIPTarget: minimum} }
	runRules(t, []ruleCase{
		{"warm ip on empty primary", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: small, Config: ipt(5, 0)},
			Plan{Action: Assign, ENI: "eni-0", Count: 5}, "short 5", "WARM_IP_TARGET 5 with nothing free: 5 in one call"},
		{"minimum floor dominates", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 3, 0, 0)...)}, Limits: small, Config: ipt(1, 7)},
			Plan{Action: Assign, ENI: "eni-0", Count: 4}, "MINIMUM_IP_TARGET 7", "max(1−3, 7−3) = 4"},
		{"ip targets override WARM_ENI_TARGET", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 8, 0)...)}, Limits: small,
			Config: Config{WarmENITarget: 2, WarmIPTarget: 1}},
			Plan{Action: Nothing}, "at target", "1 free meets WARM_IP_TARGET 1; WARM_ENI_TARGET 2 (18 free) is ignored"},
		{"count capped at the ENI's room", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 6, 6, 0)...)}, Limits: small, Config: ipt(8, 0)},
			Plan{Action: Assign, ENI: "eni-0", Count: 3}, "assign 3", "short 8 but the primary has room for 3; the next call creates an ENI"},
		{"fill an attached ENI before creating", Input{ENIs: []ENI{full("eni-0"), eni("eni-1", old, slots32("10.0.1.1", 2, 2, 0)...)}, Limits: small, Config: ipt(3, 0)},
			Plan{Action: Assign, ENI: "eni-1", Count: 3}, "on eni-1", "eni-1 has room for 7"},
		{"create with its addresses in one call", Input{ENIs: []ENI{full("eni-0"), full("eni-1")}, Limits: small, Config: ipt(3, 0)},
			Plan{Action: CreateENI, Count: 3}, "create ENI with 3 addresses", "no attached ENI has room"},
		{"create count capped at slots per ENI", Input{ENIs: []ENI{full("eni-0")}, Limits: small, Config: ipt(2, 0), Pending: 20},
			Plan{Action: CreateENI, Count: 9}, "pending 20", "22 short, one ENI holds 9"},
		{"never beyond MaxENIs", Input{ENIs: []ENI{full("eni-0"), full("eni-1"), full("eni-2")}, Limits: small, Config: ipt(2, 0)},
			Plan{Action: Nothing}, "ENI limit 3", "3 of 3 ENIs attached and full"},
		{"max pods caps the count", Input{ENIs: []ENI{full("eni-0")}, Limits: Limits{MaxENIs: 3, SlotsPerENI: 9, MaxPods: 10}, Config: ipt(5, 0)},
			Plan{Action: CreateENI, Count: 1}, "create ENI with 1 address (max pods 10)", "9 held, max pods 10: one more address at most"},
		{"at max pods", Input{ENIs: []ENI{full("eni-0")}, Limits: Limits{MaxENIs: 3, SlotsPerENI: 9, MaxPods: 9}, Config: ipt(5, 0)},
			Plan{Action: Nothing}, "max pods 9", "the node holds max pods addresses already"},
		{"max pods rounds up to a whole prefix", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 16, 0))},
			Limits: Limits{MaxENIs: 3, SlotsPerENI: 9, MaxPods: 20, PrefixSupported: true}, Config: Config{PrefixDelegation: true, WarmPrefixTarget: 3}},
			Plan{Action: Assign, ENI: "eni-0", Count: 1, Prefixes: true}, "assign 1 prefix", "16 held, max pods 20: one more /28, not three"},
		{"WARM_ENI_TARGET default fills the ENI whole", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 7, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 6, 1, 0)...)}, Limits: small},
			Plan{Action: Assign, ENI: "eni-1", Count: 3}, "WARM_ENI_TARGET 1 = 9 addresses", "7 free < 9: fill eni-1's 3 free slots, not just the 2 short"},
		{"WARM_ENI_TARGET creates a whole ENI", Input{ENIs: []ENI{full("eni-0")}, Limits: small, Config: Config{WarmENITarget: 1}},
			Plan{Action: CreateENI, Count: 9}, "create ENI with 9", "a whole ENI's worth"},
		{"WARM_ENI_TARGET 2 counts two ENIs' worth", Input{ENIs: []ENI{full("eni-0"), eni("eni-1", old, slots32("10.0.1.1", 9, 0, 0)...)},
			Limits: small, Config: Config{WarmENITarget: 2}},
			Plan{Action: CreateENI, Count: 9}, "short 9", "9 free < 18"},
		{"WARM_PREFIX_TARGET defaults to one whole prefix", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 5, 0))}, Limits: small,
			Config: Config{PrefixDelegation: true}},
			Plan{Action: Assign, ENI: "eni-0", Count: 1, Prefixes: true}, "WARM_PREFIX_TARGET 1", "a used prefix is not a free one"},
		{"WARM_PREFIX_TARGET ignores WARM_ENI_TARGET", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 5, 0), p28("10.1.0.16/28", 0, 0))}, Limits: small,
			Config: Config{PrefixDelegation: true, WarmPrefixTarget: 1, WarmENITarget: 3}},
			Plan{Action: Nothing}, "at target", "one whole free /28 kept; WARM_ENI_TARGET is not used in prefix mode"},
		{"prefix mode rounds ip targets up to /28s", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: small,
			Config: Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}},
			Plan{Action: Assign, ENI: "eni-0", Count: 2, Prefixes: true}, "short 20", "20 addresses are 2 prefixes"},
		{"prefix delegation on an instance without it", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: Limits{MaxENIs: 3, SlotsPerENI: 9},
			Config: Config{PrefixDelegation: true, WarmIPTarget: 3}},
			Plan{Action: Assign, ENI: "eni-0", Count: 3}, "assign 3 addresses", "Limits.PrefixSupported false: single addresses"},
		{"no slots per ENI", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: Limits{MaxENIs: 3}, Config: ipt(3, 0)},
			Plan{Action: Nothing}, "allow no slots", "bad limits plan nothing rather than a failing call"},
	})
}

func TestShrinkRules(t *testing.T) {
	ago := func(d time.Duration) time.Time { return t0.Add(-d) }
	ipt := func(warm, minimum int) Config { return Config{WarmIPTarget: warm, MinimumIPTarget: minimum} }
	runRules(t, []ruleCase{
		{"no address release under WARM_ENI_TARGET", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 9, 4, 0)...)}, Limits: small},
			Plan{Action: Nothing}, "at target", "14 free > 9, but the reference frees whole ENIs only under WARM_ENI_TARGET"},
		{"release surplus under WARM_IP_TARGET", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 2, 0)...)}, Limits: small, Config: ipt(2, 0)},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.0.0.3/32", "10.0.0.4/32", "10.0.0.5/32", "10.0.0.6/32", "10.0.0.7/32")},
			"release 5 addresses", "7 free, 2 wanted: the 5 lowest free addresses"},
		{"MINIMUM_IP_TARGET bounds the release", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 2, 0)...)}, Limits: small, Config: ipt(2, 8)},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.0.0.3/32")}, "release 1", "min(7−2, 9−8) = 1"},
		{"never an assigned or cooling address", Input{ENIs: []ENI{eni("eni-0", old,
			p28("10.0.0.1/32", 0, 1), p28("10.0.0.2/32", 1, 0), p28("10.0.0.3/32", 0, 0), p28("10.0.0.4/32", 0, 1), p28("10.0.0.5/32", 0, 0))},
			Limits: small, Config: ipt(1, 0)},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.0.0.3/32")}, "release 1", "2 free (cooling is not), 1 wanted; .1, .2, .4 untouchable"},
		{"release waits for the interval", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 2, 0)...)}, Limits: small, Config: ipt(2, 0),
			LastRelease: ago(10 * time.Second)},
			Plan{Action: Nothing, Until: t0.Add(20 * time.Second)}, "allowed at", "default interval 30 s, last release 10 s ago"},
		{"release interval is configurable", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 4, 2, 0)...)}, Limits: small,
			Config: Config{WarmIPTarget: 1, ReleaseInterval: 5 * time.Second}, LastRelease: ago(10 * time.Second)},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.0.0.3/32")}, "release 1", "10 s > 5 s"},
		{"prefix surplus released in whole /28s", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 10, 0), p28("10.1.0.16/28", 0, 0), p28("10.1.0.32/28", 0, 0))},
			Limits: small, Config: Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.1.0.16/28")}, "release 16", "surplus min(38−7, 48−20) = 28: one /28"},
		{"prefix surplus under 16 kept", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 10, 0), p28("10.1.0.16/28", 0, 0))},
			Limits: small, Config: Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}},
			Plan{Action: Nothing}, "at target", "surplus min(15, 12) = 12 < 16"},
		{"free prefixes beyond WARM_PREFIX_TARGET", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 5, 0), p28("10.1.0.16/28", 0, 0), p28("10.1.0.32/28", 0, 0))},
			Limits: small, Config: Config{PrefixDelegation: true, WarmPrefixTarget: 1}},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.1.0.16/28")}, "release 16", "2 whole free /28s, 1 wanted (reference, prefix mode)"},
		{"delete an unneeded ENI", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 2, 0)...), eni("eni-1", old, slots32("10.0.1.1", 3, 0, 0)...)},
			Limits: small, Config: ipt(2, 0)},
			Plan{Action: DeleteENI, ENI: "eni-1"}, "eni-1 unneeded", "7 free on the primary meet WARM_IP_TARGET 2 without eni-1"},
		{"never the primary", Input{ENIs: []ENI{eni("eni-0", old), eni("eni-1", old, slots32("10.0.1.1", 3, 1, 0)...)}, Limits: small, Config: ipt(1, 0)},
			Plan{Action: Release, ENI: "eni-1", Release: pfxs("10.0.1.2/32")}, "release 1", "the primary holds nothing but is never deleted"},
		{"never an ENI with a cooling address", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 2, 0)...), eni("eni-1", old, slots32("10.0.1.1", 3, 0, 1)...)},
			Limits: small, Config: ipt(2, 0)},
			Plan{Action: Release, ENI: "eni-1", Release: pfxs("10.0.1.2/32", "10.0.1.3/32")}, "release 2", "eni-1 cools an address: its free ones go instead"},
		{"never an ENI with an assigned address", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 9, 1, 0)...)}, Limits: small},
			Plan{Action: Nothing}, "at target", "eni-1 holds a pod"},
		{"never an ENI younger than a minute", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", 30*time.Second, slots32("10.0.1.1", 9, 0, 0)...)}, Limits: small},
			Plan{Action: Nothing, Until: t0.Add(30 * time.Second)}, "younger than ENIMinAge", "default minimum age 1 minute"},
		{"ENIMinAge is configurable", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", 30*time.Second, slots32("10.0.1.1", 9, 0, 0)...)}, Limits: small, Config: Config{ENIMinAge: 10 * time.Second}},
			Plan{Action: DeleteENI, ENI: "eni-1"}, "eni-1 unneeded", "30 s > 10 s"},
		{"never an ENI a target needs", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 5, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 9, 0, 0)...)}, Limits: small},
			Plan{Action: Nothing}, "at target", "without eni-1 only 4 free < WARM_ENI_TARGET's 9"},
		{"delete waits for the interval", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 9, 0, 0)...)}, Limits: small, LastRelease: ago(time.Second)},
			Plan{Action: Nothing, Until: t0.Add(29 * time.Second)}, "eni-1 unneeded", "an ENI deletion is a release too"},
		{"lowest ID first", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-2", old, slots32("10.0.2.1", 9, 0, 0)...), eni("eni-1", old, slots32("10.0.1.1", 9, 0, 0)...)}, Limits: small},
			Plan{Action: DeleteENI, ENI: "eni-1"}, "eni-1", "ties broken by ENI ID, not input order"},
	})
}

func TestRefusalRules(t *testing.T) {
	full := func(id string) ENI { return eni(id, old, slots32("10.0."+id[4:]+".1", 9, 9, 0)...) }
	until := t0.Add(time.Minute)
	refuse := func(k RefusalKind, eni string) []Refusal { return []Refusal{{Kind: k, Until: until, ENI: eni}} }
	ipt := Config{WarmIPTarget: 3}
	runRules(t, []ruleCase{
		{"no free /28: single addresses", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: small, Config: Config{PrefixDelegation: true, WarmIPTarget: 3},
			Refusals: refuse(RefusedNoPrefix, "")},
			Plan{Action: Assign, ENI: "eni-0", Count: 3}, "single addresses", "RefusedNoPrefix: fall back to /32s"},
		{"no free /28 under WARM_PREFIX_TARGET", Input{ENIs: []ENI{eni("eni-0", old, p28("10.1.0.0/28", 10, 0))}, Limits: small,
			Config: Config{PrefixDelegation: true, WarmPrefixTarget: 1}, Refusals: refuse(RefusedNoPrefix, "")},
			Plan{Action: Assign, ENI: "eni-0", Count: 8}, "short 10 addresses", "a prefix's worth (16) free: 6 free, 10 /32s, capped at the 8 slots left"},
		{"expired refusal ignored", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: small, Config: Config{PrefixDelegation: true, WarmIPTarget: 3},
			Refusals: []Refusal{{Kind: RefusedNoPrefix, Until: t0}}},
			Plan{Action: Assign, ENI: "eni-0", Count: 1, Prefixes: true}, "assign 1 prefix", "Until == Now is over"},
		{"ENI limit refused: wait", Input{ENIs: []ENI{full("eni-0")}, Limits: small, Config: ipt, Refusals: refuse(RefusedENILimit, "")},
			Plan{Action: Wait, Until: until}, "attachment refused", "no CreateENI while refused"},
		{"ENI limit refused: fill an attached ENI", Input{ENIs: []ENI{full("eni-0"), eni("eni-1", old)}, Limits: small, Config: ipt,
			Refusals: refuse(RefusedENILimit, "")},
			Plan{Action: Assign, ENI: "eni-1", Count: 3}, "on eni-1", "room on an attached ENI is still usable"},
		{"subnet full: wait", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: small, Config: ipt, Refusals: refuse(RefusedSubnetFull, "")},
			Plan{Action: Wait, Until: until}, "subnet full", "no Assign into a full subnet"},
		{"throttled: wait for the latest", Input{ENIs: []ENI{eni("eni-0", old)}, Limits: small, Config: ipt,
			Refusals: append(refuse(RefusedSubnetFull, ""), Refusal{Kind: RefusedThrottled, Until: until.Add(time.Minute)})},
			Plan{Action: Wait, Until: until.Add(time.Minute)}, "throttled", "growth needs both refusals over"},
		{"address limit on one ENI", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 4, 4, 0)...)}, Limits: small, Config: ipt,
			Refusals: refuse(RefusedAddressLimit, "eni-0")},
			Plan{Action: CreateENI, Count: 3}, "create ENI", "the primary's room is stale: grow elsewhere"},
		{"address limit everywhere at the ENI limit", Input{ENIs: []ENI{full("eni-0"), full("eni-1"), eni("eni-2", old)}, Limits: small, Config: ipt,
			Refusals: refuse(RefusedAddressLimit, "")},
			Plan{Action: Wait, Until: until}, "refused addresses", "nothing else to try until the refusal ends"},
		{"refusals never block a release", Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 2, 0)...)}, Limits: small, Config: Config{WarmIPTarget: 6},
			Refusals: refuse(RefusedThrottled, "")},
			Plan{Action: Release, ENI: "eni-0", Release: pfxs("10.0.0.3/32")}, "release 1", "growth failures never block shrink"},
		{"a stalled pool still deletes an empty ENI", Input{ENIs: []ENI{full("eni-0"), eni("eni-1", old)}, Limits: small, Config: ipt,
			Refusals: refuse(RefusedSubnetFull, "")},
			Plan{Action: DeleteENI, ENI: "eni-1"}, "eni-1 unneeded", "subnet full: an ENI holding no address only costs an attachment"},
	})
}
