// Package podsubnet decides where a node's next ENI goes: the subnet its
// pod addresses come from and the security groups it carries. Three modes,
// with the AWS VPC CNI's meaning and precedence:
//
//   - custom networking (AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true): the
//     subnet and security groups of the node's ENIConfig
//     (eniconfigs.crd.k8s.amazonaws.com/v1alpha1); the primary ENI holds no
//     pod address. It takes precedence over discovery.
//   - subnet discovery (ENABLE_SUBNET_DISCOVERY, default true): the subnet
//     of the node's zone with the most free addresses among the node's own
//     subnet (unless tagged kubernetes.io/role/cni=0) and the VPC's subnets
//     tagged kubernetes.io/role/cni; security groups of the primary ENI.
//   - neither: the node's subnet and the primary ENI's security groups.
//
// Rank and Select are pure; Placer calls the cloud and remembers its last
// decision for logs and the node's AddressBudget status; Provider applies the
// placement to every CreateENI that names no subnet.
package podsubnet

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/vpcip/vpcip/provider"
)

// Subnet tags read by discovery (AWS VPC CNI 1.18+, EKS user guide "Configure
// subnet selection for Pod IP addresses").
const (
	// TagCNIRole marks a subnet for pod ENIs; the value "0" excludes it,
	// the node's own subnet included. Any other value (conventionally "1"
	// or empty) includes it.
	TagCNIRole = "kubernetes.io/role/cni"
	// TagClusterPrefix starts cluster-scoped tags
	// ("kubernetes.io/cluster/<name>" = "owned" or "shared"). A discovered
	// subnet carrying any of them is used only by the clusters they name.
	TagClusterPrefix = "kubernetes.io/cluster/"
)

// Candidate is one subnet as discovery judged it.
type Candidate struct {
	Subnet   provider.Subnet
	Eligible bool
	Why      string // "node subnet", "tagged kubernetes.io/role/cni", or why it is skipped
}

// String is "subnet-…(100.64.0.0/24, 251 free, node subnet)" for logs.
func (c Candidate) String() string {
	s := c.Subnet.ID + "(" + c.Subnet.CIDR.String() + ", " + strconv.Itoa(c.Subnet.FreeAddresses) + " free, " + c.Why
	if !c.Eligible {
		s += ": skipped"
	}
	return s + ")"
}

// RankInput is what Rank judges.
type RankInput struct {
	NodeSubnet string            // the primary ENI's subnet
	Zone       string            // the node's availability zone
	VPCID      string            // the node's VPC; "" = not checked
	Cluster    string            // this cluster's name, for kubernetes.io/cluster/<name> tags
	Subnets    []provider.Subnet // the VPC's subnets in the zone (more are ignored)
}

// Rank judges every subnet for discovery and returns eligible ones first,
// most free addresses first (ties: the node's subnet, then by ID), then
// skipped ones by ID. The node's subnet is eligible unless tagged
// kubernetes.io/role/cni=0; another subnet must carry kubernetes.io/role/cni
// (not "0"), be in the node's zone and VPC, name this cluster in its
// kubernetes.io/cluster/* tags if it has any; a subnet with no free address
// is skipped.
func Rank(in RankInput) []Candidate {
	out := make([]Candidate, 0, len(in.Subnets))
	for _, s := range in.Subnets {
		c := Candidate{Subnet: s}
		c.Eligible, c.Why = judge(in, s)
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b Candidate) int {
		if a.Eligible != b.Eligible {
			if a.Eligible {
				return -1
			}
			return 1
		}
		if a.Eligible {
			if c := cmp.Compare(b.Subnet.FreeAddresses, a.Subnet.FreeAddresses); c != 0 {
				return c
			}
			if an, bn := a.Subnet.ID == in.NodeSubnet, b.Subnet.ID == in.NodeSubnet; an != bn {
				if an {
					return -1
				}
				return 1
			}
		}
		return strings.Compare(a.Subnet.ID, b.Subnet.ID)
	})
	return out
}

func judge(in RankInput, s provider.Subnet) (bool, string) {
	role, tagged := s.Tags[TagCNIRole]
	node := s.ID == in.NodeSubnet
	switch {
	case tagged && role == "0":
		return false, "tagged " + TagCNIRole + "=0"
	case s.AvailabilityZone != in.Zone:
		return false, "in zone " + s.AvailabilityZone + ", not the node's " + in.Zone
	case in.VPCID != "" && s.VPCID != "" && s.VPCID != in.VPCID:
		return false, "in " + s.VPCID + ", not the node's VPC"
	case !node && !tagged:
		return false, "not tagged " + TagCNIRole
	}
	if !node {
		if others := otherClusters(s.Tags, in.Cluster); others != "" {
			return false, "tagged for cluster " + others + ", not " + in.Cluster
		}
	}
	if s.FreeAddresses <= 0 {
		return false, "no free address"
	}
	if node {
		return true, "node subnet"
	}
	return true, "tagged " + TagCNIRole
}

// otherClusters returns the clusters a subnet's cluster-scoped tags name,
// comma-separated, when none of them is cluster; "" when it has none or one
// names cluster.
func otherClusters(tags map[string]string, cluster string) string {
	var names []string
	for k := range tags {
		if name, ok := strings.CutPrefix(k, TagClusterPrefix); ok {
			if name == cluster {
				return ""
			}
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}
