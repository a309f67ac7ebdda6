// Package monitoring tests what operators watch vpcip with: the alert rules
// (promtool check and unit tests), and the Grafana dashboards' panel queries
// evaluated by a real Prometheus scraping real vpcipd daemons on vpcsim.
package monitoring
