package main

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// Series are per scrape target (one vpcipd per node) and carry the
// Kubernetes node name as label "node", which the scrape config attaches
// (the chart's PodMonitor relabels __meta_kubernetes_pod_node_name).

// fleetPanels answer, for the whole cluster: which nodes and subnets run out
// first, whether releases complete, whether ADDs wait, what the cloud says,
// and which versions run.
var fleetPanels = []panel{
	{title: "Nodes by address budget used", kind: bars, unit: "percent", height: 10,
		description: "Assigned addresses as a percent of what the node's ENIs could hold at the ENI limit, highest first.",
		queries:     []query{{`sort_desc(100 * vpcip_addresses_assigned / (vpcip_addresses_budget > 0))`, "{{node}}"}}},
	{title: "Nodes at their ENI limit", kind: single, unit: "short", width: 6, height: 5,
		description: "Nodes with every ENI they may have attached: their budget cannot grow.",
		queries:     []query{{`count(vpcip_enis_attached >= vpcip_enis_max) or vector(0)`, ""}}},
	{title: "Daemons not ready", kind: single, unit: "short", width: 6, height: 5,
		description: "Nodes whose vpcipd assigns no address.",
		queries:     []query{{`count(vpcip_ready == 0) or vector(0)`, ""}}},
	{title: "Cluster addresses", kind: graph, unit: "short", width: 24,
		description: "Addresses held by pods, warm (free now), cooling (released, in IP_COOLDOWN_PERIOD), and the budget: what all nodes could hold at their ENI limits.",
		queries: []query{
			{`sum(vpcip_addresses_assigned)`, "assigned"},
			{`sum(vpcip_addresses_warm)`, "warm"},
			{`sum(vpcip_addresses_cooling)`, "cooling"},
			{`sum(vpcip_addresses_budget)`, "budget"},
		}},
	{title: "Free addresses per subnet", kind: graph, unit: "percent",
		description: "Free addresses (EC2's AvailableIpAddressCount) of each subnet holding the fleet's ENIs, as a percent of its usable addresses; the lowest any node saw.",
		queries: []query{{`100 * min by (subnet_id, availability_zone) (vpcip_subnet_free_addresses)` +
			` / max by (subnet_id, availability_zone) (vpcip_subnet_usable_addresses > 0)`, "{{subnet_id}} ({{availability_zone}})"}}},
	{title: "Subnet time to exhaustion", kind: bars, unit: "s",
		description: "At the rate of the last hour, how long until each draining subnet has no free address; subnets not draining are not shown.",
		queries: []query{{`min by (subnet_id, availability_zone) (vpcip_subnet_free_addresses)` +
			` / -(min by (subnet_id, availability_zone) (deriv(vpcip_subnet_free_addresses[1h])) < 0)`, "{{subnet_id}}"}}},
	{title: "Addresses without a pod", kind: graph, unit: "short",
		description: "Assigned addresses whose pods the API server no longer lists: releases not completing (0 when the daemon's Kubernetes part is off).",
		queries:     []query{{`sum by (node) (vpcip_addresses_without_pod)`, "{{node}}"}}},
	{title: "ADD wait", kind: graph, unit: "s",
		description: "How long CNI ADDs waited for an address, 50th and 99th percentile over the fleet.",
		queries: []query{
			{`histogram_quantile(0.5, sum by (le) (rate(vpcip_add_wait_seconds_bucket[$__rate_interval])))`, "p50"},
			{`histogram_quantile(0.99, sum by (le) (rate(vpcip_add_wait_seconds_bucket[$__rate_interval])))`, "p99"},
		}},
	{title: "Address requests refused, by cause", kind: graph, unit: "reqps",
		description: "ADDs answered with no address, per second, by cause (eni-limit, subnet-full, throttled, ...).",
		queries:     []query{{`sum by (cause) (rate(vpcip_add_no_address_total[$__rate_interval]))`, "{{cause}}"}}},
	{title: "EC2 calls by operation", kind: graph, unit: "reqps",
		description: "EC2 API calls per second across the fleet, by operation (instance metadata reads, which EC2 does not rate-limit, left out).",
		queries:     []query{{`sum by (operation) (rate(vpcip_provider_calls_total{operation!="imds"}[$__rate_interval]))`, "{{operation}}"}}},
	{title: "EC2 throttling", kind: graph, unit: "reqps",
		description: "Calls EC2 answered with RequestLimitExceeded, per second, by node.",
		queries:     []query{{`sum by (node) (rate(vpcip_provider_calls_total{outcome="throttled"}[$__rate_interval]))`, "{{node}}"}}},
	{title: "Daemon versions", kind: list, unit: "short",
		description: "How many nodes run each vpcipd build; more than one row for long means a rollout stopped.",
		queries:     []query{{`count by (version, go_version, checkpoint_schema) (vpcip_build_info)`, ""}}},
}

func fleet() *dashboard.DashboardBuilder {
	b := dashboard.NewDashboardBuilder("vpcip / Fleet capacity").Uid("vpcip-fleet").
		Description("Address capacity of every node and subnet running vpcip.").
		Tags([]string{"vpcip"}).Refresh("1m").Time("now-6h", "now").
		WithVariable(datasourceVariable())
	for _, p := range fleetPanels {
		b = b.WithPanel(build(p))
	}
	return b
}
