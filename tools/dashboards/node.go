package main

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// nodePanels show one node, chosen with the "node" variable.
var nodePanels = []panel{
	{title: "ENIs attached", kind: single, unit: "short", width: 6, height: 5,
		description: "ENIs attached to the node and the most it may have (instance type, capped by MAX_ENI).",
		queries: []query{
			{`vpcip_enis_attached{node="$node"}`, "attached"},
			{`vpcip_enis_max{node="$node"}`, "max"},
		}},
	{title: "Address budget used", kind: single, unit: "percent", width: 6, height: 5,
		description: "Assigned addresses as a percent of the node's budget.",
		queries:     []query{{`100 * vpcip_addresses_assigned{node="$node"} / (vpcip_addresses_budget{node="$node"} > 0)`, ""}}},
	{title: "Daemon", kind: list, unit: "short", width: 12, height: 5,
		description: "The node's vpcipd build and readiness.",
		queries:     []query{{`vpcip_build_info{node="$node"} * on (instance, job) group_left vpcip_ready`, ""}}},
	{title: "Pool", kind: graph, unit: "short", width: 24,
		description: "The node's addresses: assigned to pods, warm, cooling, what its attached ENIs could hold, and its budget at the ENI limit.",
		queries: []query{
			{`vpcip_addresses_assigned{node="$node"}`, "assigned"},
			{`vpcip_addresses_warm{node="$node"}`, "warm"},
			{`vpcip_addresses_cooling{node="$node"}`, "cooling"},
			{`vpcip_addresses_capacity{node="$node"}`, "capacity"},
			{`vpcip_addresses_budget{node="$node"}`, "budget"},
		}},
	{title: "ADD wait", kind: graph, unit: "s",
		description: "How long the node's CNI ADDs waited for an address, 50th and 99th percentile.",
		queries: []query{
			{`histogram_quantile(0.5, sum by (le) (rate(vpcip_add_wait_seconds_bucket{node="$node"}[$__rate_interval])))`, "p50"},
			{`histogram_quantile(0.99, sum by (le) (rate(vpcip_add_wait_seconds_bucket{node="$node"}[$__rate_interval])))`, "p99"},
		}},
	{title: "Address requests refused, by cause", kind: graph, unit: "reqps",
		description: "The node's ADDs answered with no address, per second, by cause.",
		queries:     []query{{`sum by (cause) (rate(vpcip_add_no_address_total{node="$node"}[$__rate_interval]))`, "{{cause}}"}}},
	{title: "EC2 calls", kind: graph, unit: "reqps",
		description: "The node's cloud API calls per second, by operation and outcome (ok, throttled, error, or the refusal).",
		queries:     []query{{`sum by (operation, outcome) (rate(vpcip_provider_calls_total{node="$node"}[$__rate_interval]))`, "{{operation}} {{outcome}}"}}},
	{title: "EC2 call latency p99", kind: graph, unit: "s",
		description: "99th percentile of the node's cloud API call latency, retries included, by operation.",
		queries:     []query{{`histogram_quantile(0.99, sum by (operation, le) (rate(vpcip_provider_call_duration_seconds_bucket{node="$node"}[$__rate_interval])))`, "{{operation}}"}}},
	{title: "Reconciliation repairs", kind: graph, unit: "short",
		description: "Differences between the node's records and the cloud or its checkpoint that the daemon repaired, by kind, per interval.",
		queries:     []query{{`sum by (kind) (increase(vpcip_reconcile_repairs_total{node="$node"}[$__rate_interval]))`, "{{kind}}"}}},
	{title: "Subnets", kind: list, unit: "short",
		description: "Free and usable addresses of the subnets holding the node's ENIs.",
		queries:     []query{{`vpcip_subnet_free_addresses{node="$node"}`, ""}}},
}

func node() *dashboard.DashboardBuilder {
	nodes := dashboard.NewQueryVariableBuilder("node").Label("Node").
		Query(dashboard.StringOrMap{String: cog.ToPtr(`label_values(vpcip_ready, node)`)}).
		Datasource(datasource()).Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc)
	b := dashboard.NewDashboardBuilder("vpcip / Node detail").Uid("vpcip-node").
		Description("One node's ENIs, address pool, ADD waits, cloud calls and repairs.").
		Tags([]string{"vpcip"}).Refresh("1m").Time("now-3h", "now").
		WithVariable(datasourceVariable()).WithVariable(nodes)
	for _, p := range nodePanels {
		b = b.WithPanel(build(p))
	}
	return b
}
