package monitoring

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// view is what one panel's queries returned in the scenario: per query (in
// panel order) the series, instant at the end for instant panels, over the
// scenario for graphs.
type view struct {
	node    string // the node variable, on the node dashboard
	run     *run
	results [][]series
}

// expectations give, per dashboard UID and panel title, what the panel must
// show after the scenario. Every panel has one, and each fails on an empty
// or wrong panel.
var expectations = map[string]func(t *testing.T, v view){
	"vpcip-fleet/Nodes by address budget used": func(t *testing.T, v view) {
		s := v.results[0]
		if len(s) != 2 || s[0].labels["node"] != "node-1" {
			t.Fatalf("want node-1 first of 2 nodes, got %v", s)
		}
		eq(t, "node-1", s[0].last(), 100)
		eq(t, "node-2", s[1].last(), 100*float64(smallPods-leaked)/budget)
	},
	"vpcip-fleet/Nodes at their ENI limit": func(t *testing.T, v view) { eq(t, "count", only(t, v.results[0]).last(), 1) },
	"vpcip-fleet/Daemons not ready":        func(t *testing.T, v view) { eq(t, "count", only(t, v.results[0]).last(), 0) },
	"vpcip-fleet/Cluster addresses": func(t *testing.T, v view) {
		var assigned, warm, cooling, budget float64
		for _, st := range v.run.status {
			assigned += float64(st.Assigned)
			warm += float64(st.Warm)
			cooling += float64(st.Cooling)
			budget += float64(st.Budget)
		}
		for i, want := range []float64{assigned, warm, cooling, budget} {
			eq(t, fmt.Sprintf("query %d", i), only(t, v.results[i]).last(), want)
		}
	},
	"vpcip-fleet/Free addresses per subnet": func(t *testing.T, v view) {
		small := find(t, v.results[0], map[string]string{"subnet_id": smallSubnet, "availability_zone": "us-west-2b"})
		eq(t, "small subnet now, %", small.last(), 0)
		if small.max() < 100*5.0/11 {
			t.Errorf("the small subnet was never seen with 5 of its 11 addresses free (max %v%%): the panel misses the draining", small.max())
		}
		eq(t, "big subnet now, %", find(t, v.results[0], map[string]string{"subnet_id": bigSubnet}).last(), 100*float64(v.run.bigFree)/4091)
	},
	"vpcip-fleet/Subnet time to exhaustion": func(t *testing.T, v view) {
		// Instant at the end: the small subnet has stopped draining (it is
		// empty); the panel's query over the scenario must have shown it.
		s := v.results[0]
		for _, x := range s {
			if x.last() < 0 || math.IsInf(x.last(), 0) {
				t.Errorf("%v: %v seconds to exhaustion", x.labels, x.last())
			}
		}
		during, err := v.run.prom.span(t.Context(), v.expr(0), v.run.start, v.run.end, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		small := find(t, during, map[string]string{"subnet_id": smallSubnet})
		if m := small.max(); !(m > 0) {
			t.Errorf("the draining small subnet never had a finite time to exhaustion (max %v)", m)
		}
	},
	"vpcip-fleet/Addresses without a pod": func(t *testing.T, v view) {
		if len(v.results[0]) != 2 {
			t.Fatalf("want one series per node, got %v", v.results[0])
		}
		for _, s := range v.results[0] {
			eq(t, s.labels["node"]+" (Kubernetes part off)", s.max(), 0)
		}
	},
	"vpcip-fleet/ADD wait":                           checkQuantiles,
	"vpcip-fleet/Address requests refused, by cause": func(t *testing.T, v view) { positive(t, v.results[0], "cause", "eni-limit", "subnet-full") },
	"vpcip-fleet/EC2 calls by operation": func(t *testing.T, v view) {
		positive(t, v.results[0], "operation", "AssignPrivateIpAddresses", "CreateNetworkInterface", "DescribeSubnets")
	},
	"vpcip-fleet/EC2 throttling": func(t *testing.T, v view) { positive(t, v.results[0], "node", "node-1") },
	"vpcip-fleet/Daemon versions": func(t *testing.T, v view) {
		s := only(t, v.results[0])
		if s.labels["version"] != "dev" || s.labels["checkpoint_schema"] != "1" || !strings.HasPrefix(s.labels["go_version"], "go") {
			t.Errorf("labels %v", s.labels)
		}
		eq(t, "nodes on the version", s.last(), 2)
	},

	"vpcip-node/ENIs attached": func(t *testing.T, v view) {
		st := v.run.status[v.node]
		eq(t, "attached", only(t, v.results[0]).last(), float64(st.ENIs))
		eq(t, "max", only(t, v.results[1]).last(), 3)
	},
	"vpcip-node/Address budget used": func(t *testing.T, v view) {
		st := v.run.status[v.node]
		eq(t, "percent", only(t, v.results[0]).last(), 100*float64(st.Assigned)/float64(st.Budget))
	},
	"vpcip-node/Daemon": func(t *testing.T, v view) {
		s := only(t, v.results[0])
		if s.labels["version"] != "dev" || s.labels["node"] != v.node {
			t.Errorf("labels %v", s.labels)
		}
		eq(t, "ready", s.last(), 1)
	},
	"vpcip-node/Pool": func(t *testing.T, v view) {
		st := v.run.status[v.node]
		for i, want := range []int{st.Assigned, st.Warm, st.Cooling, st.Capacity, st.Budget} {
			eq(t, fmt.Sprintf("query %d", i), only(t, v.results[i]).last(), float64(want))
		}
	},
	"vpcip-node/ADD wait": checkQuantiles,
	"vpcip-node/Address requests refused, by cause": func(t *testing.T, v view) {
		positive(t, v.results[0], "cause", map[string]string{"node-1": "eni-limit", "node-2": "subnet-full"}[v.node])
	},
	"vpcip-node/EC2 calls": func(t *testing.T, v view) {
		for _, op := range []string{"AssignPrivateIpAddresses", "DescribeSubnets"} {
			if s := find(t, v.results[0], map[string]string{"operation": op, "outcome": "ok"}); !(s.max() > 0) {
				t.Errorf("%s ok never above 0", op)
			}
		}
		if v.node == "node-1" {
			s := find(t, v.results[0], map[string]string{"operation": "AssignPrivateIpAddresses", "outcome": "throttled"})
			if !(s.max() > 0) {
				t.Errorf("node-1's throttled assignments not shown: %v", s.values)
			}
		}
	},
	"vpcip-node/EC2 call latency p99": func(t *testing.T, v view) {
		s := find(t, v.results[0], map[string]string{"operation": "AssignPrivateIpAddresses"})
		if m := s.max(); !(m > 0) || m > 60 {
			t.Errorf("p99 latency of AssignPrivateIpAddresses %v s", m)
		}
	},
	"vpcip-node/Reconciliation repairs": func(t *testing.T, v view) {
		if v.node == "node-1" { // nothing to repair there
			for _, s := range v.results[0] {
				eq(t, s.labels["kind"], s.max(), 0)
			}
			return
		}
		// node-2: the leaked pods' addresses, released by CNI GC.
		if m := find(t, v.results[0], map[string]string{"kind": "gc_released"}).max(); m < 0.9 {
			t.Errorf("gc_released repairs shown: %v, want the leaked addresses", m)
		}
	},
	"vpcip-node/Subnets": func(t *testing.T, v view) {
		s := only(t, v.results[0])
		want := map[string]float64{"node-1": float64(v.run.bigFree), "node-2": 0}[v.node]
		eq(t, s.labels["subnet_id"], s.last(), want)
	},
}

// checkQuantiles: p50 and p99 lines both drawn, p99 ≥ p50, within VPCIP_ADD_WAIT
// plus the plugin's own time.
func checkQuantiles(t *testing.T, v view) {
	p50, p99 := only(t, v.results[0]).max(), only(t, v.results[1]).max()
	if !(p50 > 0) || !(p99 >= p50) || p99 > 10 {
		t.Errorf("ADD wait p50 %v s, p99 %v s: want both drawn, p99 ≥ p50, at most 10 s", p50, p99)
	}
}

func (v view) expr(i int) string { return v.run.exprs[i] }

func eq(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6 || got != got {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// only returns the single series of a result.
func only(t *testing.T, s []series) series {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("want exactly one series, got %d: %v", len(s), s)
	}
	return s[0]
}

// find returns the one series whose labels include want.
func find(t *testing.T, s []series, want map[string]string) series {
	t.Helper()
	var found []series
	for _, x := range s {
		if matches(x.labels, want) {
			found = append(found, x)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one series with %v, got %d of %v", want, len(found), s)
	}
	return found[0]
}

// positive checks that, for each value of label, a series shows it above 0
// at some point.
func positive(t *testing.T, s []series, label string, values ...string) {
	t.Helper()
	for _, val := range values {
		if m := find(t, s, map[string]string{label: val}).max(); !(m > 0) {
			t.Errorf("%s=%s: never above 0 (max %v)", label, val, m)
		}
	}
}

// checkPanels evaluates every query of every panel as Grafana would (range
// queries for graphs over the scenario, instant queries at its end), with
// the node variable resolved as Grafana resolves it, and checks the result.
func checkPanels(t *testing.T, r *run) {
	seen := map[string]bool{}
	fleet := &dump{Dashboard: "vpcip-fleet", Start: r.start, End: r.end}
	defer fleet.write(t)
	for uid, d := range loadDashboards(t) {
		nodes := []string{""}
		for _, tv := range d.Templating.List {
			if tv.Name != "node" {
				continue
			}
			m := regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`).FindStringSubmatch(fmt.Sprint(tv.Query))
			if m == nil {
				t.Fatalf("%s: node variable query %v", uid, tv.Query)
			}
			var err error
			if nodes, err = r.prom.labelValues(t.Context(), m[2], m[1]); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(nodes, []string{"node-1", "node-2"}) {
				t.Fatalf("%s: node variable offers %v, want node-1 and node-2", uid, nodes)
			}
		}
		for _, p := range d.Panels {
			key := uid + "/" + p.Title
			seen[key] = true
			check := expectations[key]
			if check == nil {
				t.Errorf("panel %s has no expectation: add one", key)
				continue
			}
			for _, node := range nodes {
				t.Run(strings.TrimSpace(key+" "+node), func(t *testing.T) {
					v := view{node: node, run: r}
					rep := strings.NewReplacer("$node", node, "$__rate_interval", "15s")
					r.exprs = r.exprs[:0]
					for _, q := range p.Targets {
						expr := rep.Replace(q.Expr)
						r.exprs = append(r.exprs, expr)
						var res []series
						var err error
						if q.Instant {
							res, err = r.prom.instant(t.Context(), expr, r.end)
						} else {
							res, err = r.prom.span(t.Context(), expr, r.start, r.end, 2*time.Second)
						}
						if err != nil {
							t.Fatalf("%s: %v", expr, err)
						}
						v.results = append(v.results, res)
					}
					if uid == fleet.Dashboard {
						var legends []string
						for _, q := range p.Targets {
							legends = append(legends, q.LegendFormat)
						}
						fleet.record(p.Title, p.Type, legends, v.results)
					}
					check(t, v)
				})
			}
		}
	}
	for key := range expectations {
		if !seen[key] {
			t.Errorf("expectation for %s, which no dashboard has", key)
		}
	}
}
