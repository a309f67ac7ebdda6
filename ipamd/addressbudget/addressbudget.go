// Package addressbudget holds the AddressBudget resource (vpcip.io/v1alpha1,
// cluster-scoped, one per node and named after it; CRD in
// charts/vpcip/crds/addressbudgets.vpcip.io.yaml) as Go types, and a small
// client over client-go's dynamic client. Each node's vpcipd writes its own
// object's status; `kubectl get addressbudgets` shows the fleet.
package addressbudget

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/vpcip/vpcip/ipamd/api"
)

// Group, Version and Kind of the resource.
const (
	Group   = "vpcip.io"
	Version = "v1alpha1"
	Kind    = "AddressBudget"
)

// Resource is the resource the CRD serves.
var Resource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "addressbudgets"}

// AddressBudget is one node's published address budget.
type AddressBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            Status `json:"status,omitempty"`
}

// Status is what the node's daemon publishes. Counts are pod addresses (ENI
// primary addresses excluded), as in `vpcipctl capacity`.
type Status struct {
	InstanceType     string             `json:"instanceType,omitempty"` // e.g. "m5.large"
	InstanceID       string             `json:"instanceID,omitempty"`
	Zone             string             `json:"zone,omitempty"`
	PrefixMode       bool               `json:"prefixMode,omitempty"`
	ENIs             ENIs               `json:"enis"`
	Addresses        Addresses          `json:"addresses"`
	UsedPercent      int                `json:"usedPercent"` // Assigned*100/Budget, rounded down; 0 when Budget is 0
	Subnets          []Subnet           `json:"subnets,omitempty"`
	SubnetFree       *int               `json:"subnetFree,omitempty"` // sum of Subnets[].Free; nil until the subnets were read
	MaxPods          MaxPods            `json:"maxPods"`
	Version          string             `json:"version,omitempty"` // vpcipd version
	CheckpointSchema int                `json:"checkpointSchema,omitempty"`
	PodSubnet        *PodSubnet         `json:"podSubnet,omitempty"` // nil until the daemon placed an ENI
	Conditions       []metav1.Condition `json:"conditions,omitempty"`
}

// PodSubnet is where the node's latest new ENI went and why (package
// ipamd/podsubnet), or why none can be placed.
type PodSubnet struct {
	Mode           string   `json:"mode"` // "subnet-discovery", "custom-networking" or "node-subnet"
	Subnet         string   `json:"subnet,omitempty"`
	SecurityGroups []string `json:"securityGroups,omitempty"`
	ENIConfig      string   `json:"eniConfig,omitempty"` // custom networking: the node's ENIConfig
	Reason         string   `json:"reason,omitempty"`    // the choice and why, with free counts
	Problem        string   `json:"problem,omitempty"`   // why no ENI can be placed now
	Cause          string   `json:"cause,omitempty"`     // the problem's name, the PodSubnetReady condition's reason
}

// ENIs counts the node's ENIs.
type ENIs struct {
	Attached int    `json:"attached"` // pod ENIs attached (api.Counts.ENIs: the primary not counted under custom networking)
	Max      int    `json:"max"`      // pod ENIs the instance type allows, capped by MAX_ENI
	Summary  string `json:"summary"`  // "Attached/Max", the ENIS column
}

// Addresses counts pod addresses. Invariant (checked by Check):
// Assigned ≤ Assigned+Warm+Cooling ≤ Capacity ≤ Budget.
type Addresses struct {
	Assigned int `json:"assigned"` // held by pods
	Warm     int `json:"warm"`     // free, ready to assign
	Cooling  int `json:"cooling"`  // released, in IP_COOLDOWN_PERIOD
	Capacity int `json:"capacity"` // what the attached ENIs could hold
	Budget   int `json:"budget"`   // what the node could hold at its ENI limit
}

// Subnet is one subnet the node's ENIs are in.
type Subnet struct {
	ID   string `json:"id"`
	CIDR string `json:"cidr,omitempty"`
	Free int    `json:"free"` // EC2 AvailableIpAddressCount, from a cached DescribeSubnets
	// FreePrefixes is how many aligned /28s of the subnet hold no address
	// and no AWS reserve: the prefixes EC2 can still delegate before it
	// answers InsufficientCidrBlocks (from the daemon's cached
	// DescribeNetworkInterfaces by subnet-id, as the metric
	// vpcip_subnet_free_prefixes); nil until read.
	FreePrefixes *int `json:"freePrefixes,omitempty"`
}

// MaxPods compares what the addresses allow with what kubelet admits.
type MaxPods struct {
	Addresses int `json:"addresses"`         // Budget + 2 host-network pods (the EKS max-pods formula's allowance)
	Kubelet   int `json:"kubelet,omitempty"` // the Node's status.capacity.pods; 0 when unknown
}

// Condition types of Status.Conditions.
const (
	ConditionReady                   = "Ready"                   // the daemon can assign addresses
	ConditionAddressesLow            = "AddressesLow"            // few addresses left below the budget
	ConditionAtENILimit              = "AtENILimit"              // every ENI the node may have is attached
	ConditionSubnetLow               = "SubnetLow"               // the node's subnets are nearly full
	ConditionMaxPodsExceedsAddresses = "MaxPodsExceedsAddresses" // kubelet admits more pods than addresses can serve
	ConditionPodSubnetReady          = "PodSubnetReady"          // new ENIs can be placed (False: a missing or invalid ENIConfig, no eligible subnet)
	ConditionSandboxNetnsVisible     = "SandboxNetnsVisible"     // vpcipd sees the pods' netns, so a pod gone without a DEL has its address released (False: kept until the leak check)
)

// Check reports a broken invariant of the published numbers (field failure
// K03: "assigned" above "total"), or nil.
func (s Status) Check() error {
	a := s.Addresses
	var errs []error
	if held := a.Assigned + a.Warm + a.Cooling; held > a.Capacity {
		errs = append(errs, fmt.Errorf("held %d (assigned %d + warm %d + cooling %d) above capacity %d", held, a.Assigned, a.Warm, a.Cooling, a.Capacity))
	}
	if a.Capacity > a.Budget {
		errs = append(errs, fmt.Errorf("capacity %d above budget %d", a.Capacity, a.Budget))
	}
	if s.ENIs.Attached > s.ENIs.Max {
		errs = append(errs, fmt.Errorf("%d ENIs attached above the limit %d", s.ENIs.Attached, s.ENIs.Max))
	}
	if want := Percent(a.Assigned, a.Budget); s.UsedPercent != want {
		errs = append(errs, fmt.Errorf("usedPercent %d, want %d", s.UsedPercent, want))
	}
	return errors.Join(errs...)
}

// HostNetworkAllowance is the number of host-network pods (the node daemon
// and kube-proxy) the EKS max-pods formula adds to the address count:
// ENIs × (IPv4 addresses per ENI − 1) + 2.
const HostNetworkAllowance = 2

// SetCounts renders the pool's counts into s: ENIs, Addresses, UsedPercent
// and MaxPods.Addresses (Budget + HostNetworkAllowance). It is the only
// place the AddressBudget takes numbers from the daemon.
func (s *Status) SetCounts(c api.Counts) {
	s.ENIs = ENIs{Attached: c.ENIs, Max: c.MaxENIs, Summary: fmt.Sprintf("%d/%d", c.ENIs, c.MaxENIs)}
	s.Addresses = Addresses{Assigned: c.Assigned, Warm: c.Warm, Cooling: c.Cooling, Capacity: c.Capacity, Budget: c.Budget}
	s.UsedPercent = Percent(c.Assigned, c.Budget)
	s.MaxPods.Addresses = c.Budget + HostNetworkAllowance
}

// Counts reads back the pool's counts s shows (the inverse of SetCounts).
func (s Status) Counts() api.Counts {
	a := s.Addresses
	return api.Counts{Assigned: a.Assigned, Warm: a.Warm, Cooling: a.Cooling, Capacity: a.Capacity, Budget: a.Budget,
		ENIs: s.ENIs.Attached, MaxENIs: s.ENIs.Max}
}

// Percent is part*100/whole rounded down, 0 when whole is 0.
func Percent(part, whole int) int {
	if whole <= 0 {
		return 0
	}
	return part * 100 / whole
}

// Client reads and writes AddressBudgets through a dynamic client.
type Client struct {
	res dynamic.NamespaceableResourceInterface
}

// NewClient returns a Client over dyn.
func NewClient(dyn dynamic.Interface) *Client {
	return &Client{res: dyn.Resource(Resource)}
}

// Get reads the AddressBudget named name (a node name).
func (c *Client) Get(ctx context.Context, name string) (*AddressBudget, error) {
	u, err := c.res.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return fromUnstructured(u)
}

// List reads every AddressBudget.
func (c *Client) List(ctx context.Context) ([]AddressBudget, error) {
	l, err := c.res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]AddressBudget, 0, len(l.Items))
	for i := range l.Items {
		ab, err := fromUnstructured(&l.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, *ab)
	}
	return out, nil
}

// Create creates ab (its status is dropped by the API server: write it with
// UpdateStatus).
func (c *Client) Create(ctx context.Context, ab *AddressBudget) (*AddressBudget, error) {
	u, err := toUnstructured(ab)
	if err != nil {
		return nil, err
	}
	u, err = c.res.Create(ctx, u, metav1.CreateOptions{FieldManager: "vpcipd"})
	if err != nil {
		return nil, err
	}
	return fromUnstructured(u)
}

// Update writes ab's metadata (owner references, labels); ab.ResourceVersion
// must be current or the API server answers Conflict.
func (c *Client) Update(ctx context.Context, ab *AddressBudget) (*AddressBudget, error) {
	u, err := toUnstructured(ab)
	if err != nil {
		return nil, err
	}
	u, err = c.res.Update(ctx, u, metav1.UpdateOptions{FieldManager: "vpcipd"})
	if err != nil {
		return nil, err
	}
	return fromUnstructured(u)
}

// UpdateStatus writes ab's status through the status subresource;
// ab.ResourceVersion must be current or the API server answers Conflict.
func (c *Client) UpdateStatus(ctx context.Context, ab *AddressBudget) (*AddressBudget, error) {
	u, err := toUnstructured(ab)
	if err != nil {
		return nil, err
	}
	u, err = c.res.UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: "vpcipd"})
	if err != nil {
		return nil, err
	}
	return fromUnstructured(u)
}

func toUnstructured(ab *AddressBudget) (*unstructured.Unstructured, error) {
	ab.APIVersion, ab.Kind = Group+"/"+Version, Kind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ab)
	if err != nil {
		return nil, fmt.Errorf("addressbudget %s: %w", ab.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func fromUnstructured(u *unstructured.Unstructured) (*AddressBudget, error) {
	var ab AddressBudget
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ab); err != nil {
		return nil, fmt.Errorf("addressbudget %s: %w", u.GetName(), err)
	}
	return &ab, nil
}
