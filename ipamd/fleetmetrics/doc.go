// Package fleetmetrics holds the daemon's metrics that answer fleet-wide
// capacity questions beyond the node's own pool gauges (docs/design.md §8):
// free addresses of the subnets the node's ENIs are in (a paced, cached
// EC2 DescribeSubnets), the build of the running daemon, the addresses held
// without a live pod (a number the Kubernetes part supplies), and, as an
// opt-in, the AWS VPC CNI's awscni_* series with the reference's names and
// meanings (gauges from the pool's status, counters and the rest derived
// from vpcip's own series at each scrape) so that existing aws-node
// dashboards and alerts keep working.
package fleetmetrics
