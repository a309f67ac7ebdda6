// Package introspect is vpcipd's read-only view for operators: the JSON
// shapes of the daemon's state (node, pool counts, ENIs, assignments,
// addresses in cooldown, effective config, readiness), an HTTP handler that
// serves them and a client that reads them. The daemon serves it on
// INTROSPECTION_BIND_ADDRESS (default 127.0.0.1:61679, docs/design.md §5);
// vpcipctl is its client.
//
// Endpoints (GET only, JSON bodies):
//
//	/v1/state   State
//	/v1/pool    Pool
//	/v1/enis    []ENI
//	/v1/pods    Pods (assignments and addresses in cooldown)
//	/v1/config  map[string]string
//	/healthz    Health; 200 when ready, 503 otherwise (a readiness probe)
//	/livez      Health; 200 whenever the daemon answers, ready or not (a
//	            liveness probe: waiting for the cloud is not a reason to restart)
//
// Ready means start-up reconciliation succeeded once (instance, limits and
// ENIs read from EC2, host set up); it stays true afterwards, also while the
// warm pool is empty and growth waits for EC2, so neither probe fails then.
//
// The daemon builds a State from its datastore on every request; the handler
// never changes anything.
package introspect

import (
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// DefaultAddr is the introspection listen address (docs/design.md §5).
const DefaultAddr = "127.0.0.1:61679"

// State is everything the daemon shows about itself at one moment.
type State struct {
	Node        NodeInfo          `json:"node"`
	Pool        api.Counts        `json:"pool"`        // the pool in numbers (see api.Counts for what each counts)
	ENIs        []ENI             `json:"enis"`        // attached ENIs, by device number
	Assignments []Assignment      `json:"assignments"` // addresses held by pods, by address
	Cooling     []CoolingAddress  `json:"cooling"`     // released addresses waiting out IP_COOLDOWN_PERIOD
	Config      map[string]string `json:"config"`      // effective configuration, by environment variable name
	Ready       bool              `json:"ready"`       // the daemon can assign addresses (CNI STATUS succeeds)
	Reason      string            `json:"reason,omitempty"`
	Kubernetes  Kubernetes        `json:"kubernetes"`
	Time        time.Time         `json:"time"` // when the daemon took this view
	// Placement is where the latest new ENI went (or why none can be
	// placed); nil before the daemon placed one.
	Placement *Placement `json:"placement,omitempty"`
	// SandboxNetns says whether vpcipd sees the pod sandboxes' netns, its
	// witness that a pod went without a DEL; nil without a host view
	// (VPCIP_HOSTNET=false) or before the first check.
	SandboxNetns *SandboxNetns `json:"sandboxNetns,omitempty"`
}

// SandboxNetns is the netns witness's view: Visible when at least one
// directory holding sandboxes' netns is seen (Dirs); Reason says why not.
// Without it, an address whose host route vanished stays held until DEL or
// the Kubernetes leak check (the API server's word) releases it.
type SandboxNetns struct {
	Visible bool     `json:"visible"`
	Dirs    []string `json:"dirs,omitempty"`
	Reason  string   `json:"reason,omitempty"`
}

// Placement is the latest decision of where a new ENI goes: the mode
// ("subnet-discovery", "custom-networking", "node-subnet"), the subnet and
// security groups chosen, the node's ENIConfig under custom networking, and
// why (with the subnets' free addresses); Problem is set when no ENI can be
// placed (a missing or invalid ENIConfig, no eligible subnet).
type Placement struct {
	At             time.Time `json:"at"`
	Mode           string    `json:"mode"`
	SubnetID       string    `json:"subnetID,omitempty"`
	SecurityGroups []string  `json:"securityGroups,omitempty"`
	ENIConfig      string    `json:"eniConfig,omitempty"`
	Reason         string    `json:"reason,omitempty"`
	Problem        string    `json:"problem,omitempty"`
	Cause          string    `json:"cause,omitempty"` // the problem's name: ENIConfigNotFound, ENIConfigInvalid, NoPodSubnet, PodSubnetsFull, ENIPlacementFailed
}

// Kubernetes is the state of the daemon's Kubernetes part (ipamd/cluster).
// Addresses are served in every state.
type Kubernetes struct {
	Enabled   bool   `json:"enabled"`          // MY_NODE_NAME and an API server configured
	Connected bool   `json:"connected"`        // caches synced, API server answering
	Reason    string `json:"reason,omitempty"` // why not enabled or connected, e.g. "disabled: MY_NODE_NAME unset"
}

// NodeInfo identifies the node and its instance (from IMDS).
type NodeInfo struct {
	Name             string     `json:"name,omitempty"` // Kubernetes node name, when known
	InstanceID       string     `json:"instanceID"`     // e.g. "i-0123456789abcdef0"
	InstanceType     string     `json:"instanceType"`   // e.g. "m5.large"
	AvailabilityZone string     `json:"availabilityZone,omitempty"`
	PrimaryIP        netip.Addr `json:"primaryIP"` // primary private IPv4 of the primary ENI
	Mode             string     `json:"mode"`      // ModeSecondaryIP, ModePrefix or ModeIPv6Prefix
	Version          string     `json:"version,omitempty"`
	StartedAt        time.Time  `json:"startedAt"` // when the daemon process started
}

// Address modes of a node.
const (
	ModeSecondaryIP = "secondary-ip" // one secondary IP per pod (EC2 AssignPrivateIpAddresses)
	ModePrefix      = "prefix"       // /28 prefixes split into pod addresses (ENABLE_PREFIX_DELEGATION)
	ModeIPv6Prefix  = "ipv6-prefix"  // IPv6 pods from one /80 on the primary ENI (ENABLE_IPv6)
)

// ENI is one attached ENI and the pod addresses it holds.
type ENI struct {
	ID           string         `json:"id"`           // e.g. "eni-0123456789abcdef0"
	MAC          string         `json:"mac"`          // lower-case, colon-separated
	DeviceNumber int            `json:"deviceNumber"` // 0 is the primary ENI
	RouteTable   int            `json:"routeTable"`   // routing.TableForDevice(DeviceNumber): 254 (main) for the primary
	LinkName     string         `json:"linkName,omitempty"`
	SubnetID     string         `json:"subnetID"`
	SubnetCIDR   netip.Prefix   `json:"subnetCIDR"`
	PrimaryIP    netip.Addr     `json:"primaryIP"` // the ENI's own address, never given to a pod
	Addresses    []netip.Addr   `json:"addresses"` // secondary IPs (or addresses out of Prefixes) usable by pods
	Prefixes     []netip.Prefix `json:"prefixes,omitempty"`
	Capacity     int            `json:"capacity"` // pod addresses this ENI could hold at most
}

// Assignment is one address held by one attachment.
type Assignment struct {
	Key        api.Key    `json:"key"` // CNI attachment: network, container ID, ifname
	Pod        api.Pod    `json:"pod"` // namespace, name, UID
	Address    netip.Addr `json:"address"`
	ENIID      string     `json:"eniID"`
	AssignedAt time.Time  `json:"assignedAt"`
}

// CoolingAddress is a released address that is not handed out again before
// UnassignedAt + IP_COOLDOWN_PERIOD (B11: this survives restarts).
type CoolingAddress struct {
	Address      netip.Addr `json:"address"`
	ENIID        string     `json:"eniID"`
	UnassignedAt time.Time  `json:"unassignedAt"`
}

// Pods is the /v1/pods body.
type Pods struct {
	Assignments []Assignment     `json:"assignments"`
	Cooling     []CoolingAddress `json:"cooling"`
}

// Health is the /healthz body.
type Health struct {
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
}
