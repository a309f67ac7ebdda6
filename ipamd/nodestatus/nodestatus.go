// Package nodestatus is the node's status at one moment as vpcipd publishes
// it: readiness and the pool's counts (api.Counts), the instance and its
// limits, where the latest ENI went, whether the daemon sees the sandboxes'
// netns, and which pods hold addresses.
//
// The daemon (package ipamd) makes a Snapshot after every pass of its worker
// and hands it to its status sink; the Kubernetes part (package
// ipamd/cluster) is that sink and renders the AddressBudget from it. The
// package holds types only, so the sink needs nothing of the daemon's
// internals (docs/design.md §3).
package nodestatus

import (
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// Snapshot is the node's status at Time.
type Snapshot struct {
	Time     time.Time
	Instance provider.Instance // zero until start-up learned it
	Limits   warmpool.Limits   // MaxENIs capped by MAX_ENI, without the primary under custom networking
	// Status is readiness, its reason and the pool's Counts, as the plugin
	// API's status endpoint answers.
	Status api.Status
	// PrefixMode: pod addresses come in /28 prefixes (ENABLE_PREFIX_DELEGATION
	// on an instance type that supports them).
	PrefixMode bool
	// Placement is the latest decision of where a new ENI goes, and why
	// (zero Mode before the first).
	Placement podsubnet.Decision
	// SandboxNetns is whether the daemon sees the sandboxes' netns (its
	// witness that a pod went without a DEL); nil before the first look and
	// always without a host view.
	SandboxNetns *SandboxNetns
	// Held lists the attachments holding an address, with their pods (from
	// CNI_ARGS; empty when the runtime gave none). Filled in the snapshots
	// sent to the status sink only.
	Held []Held
	// Version is vpcipd's version; CheckpointSchema the checkpoint schema
	// version it writes.
	Version          string
	CheckpointSchema int
}

// SandboxNetns is the sandbox-netns witness's view.
type SandboxNetns struct {
	Visible bool     // at least one netns directory is seen
	Dirs    []string // the directories seen, sorted
	Reason  string   // why none is seen ("" when Visible)
}

// Held is one attachment that holds an address.
type Held struct {
	Key api.Key // CNI attachment key: network, container ID, ifname
	Pod api.Pod // namespace, name, UID; empty when unknown
}
