package podsubnet

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vpcip/vpcip/provider"
)

// ENIConfig resource and node keys, as the AWS VPC CNI defines them
// (CRD eniconfigs.crd.k8s.amazonaws.com, served as v1alpha1, cluster-scoped;
// spec.subnet required, spec.securityGroups optional).
const (
	ENIConfigGroup    = "crd.k8s.amazonaws.com"
	ENIConfigVersion  = "v1alpha1"
	ENIConfigResource = "eniconfigs"
	// LabelExternalENIConfig names the node's ENIConfig ahead of every
	// other source (set by tools that manage ENIConfigs for the node).
	LabelExternalENIConfig = "vpc.amazonaws.com/externalEniConfig"
	// DefaultENIConfigKey is the default of ENI_CONFIG_ANNOTATION_DEF and
	// ENI_CONFIG_LABEL_DEF.
	DefaultENIConfigKey = "k8s.amazonaws.com/eniConfig"
	// DefaultENIConfigName is used when no label or annotation names one.
	DefaultENIConfigName = "default"
)

// ENIConfig is one ENIConfig object's spec.
type ENIConfig struct {
	Name           string   // metadata.name
	Subnet         string   // spec.subnet: a subnet ID in the node's zone
	SecurityGroups []string // spec.securityGroups: group IDs; empty = the primary ENI's
}

// Errors of custom networking. Both leave the pool waiting: no ENI is made
// until the node's ENIConfig exists and is valid.
var (
	// ErrNoENIConfig: the ENIConfig the node selects does not exist (or
	// ENIConfigs cannot be read yet).
	ErrNoENIConfig = errors.New("ENIConfig not found")
	// ErrInvalidENIConfig: the node's ENIConfig names no subnet, a subnet
	// that does not exist, or one in another zone or VPC.
	ErrInvalidENIConfig = errors.New("ENIConfig invalid")
)

// NodeKeys are the node label and annotation keys that name its ENIConfig.
type NodeKeys struct {
	Annotation string // ENI_CONFIG_ANNOTATION_DEF; "" = DefaultENIConfigKey
	Label      string // ENI_CONFIG_LABEL_DEF; "" = DefaultENIConfigKey
}

// ConfigName returns the name of the ENIConfig a node selects and where the
// name came from, in the AWS VPC CNI's order: the label
// vpc.amazonaws.com/externalEniConfig, then the annotation keys.Annotation,
// then the label keys.Label, then "default". With
// ENI_CONFIG_LABEL_DEF=topology.kubernetes.io/zone every node of a zone
// selects the ENIConfig named after the zone. Empty values are skipped.
func ConfigName(labels, annotations map[string]string, keys NodeKeys) (name, source string) {
	if keys.Annotation == "" {
		keys.Annotation = DefaultENIConfigKey
	}
	if keys.Label == "" {
		keys.Label = DefaultENIConfigKey
	}
	if v := labels[LabelExternalENIConfig]; v != "" {
		return v, "label " + LabelExternalENIConfig
	}
	if v := annotations[keys.Annotation]; v != "" {
		return v, "annotation " + keys.Annotation
	}
	if v := labels[keys.Label]; v != "" {
		return v, "label " + keys.Label
	}
	return DefaultENIConfigName, "no label or annotation names one"
}

// CheckENIConfig checks an ENIConfig against the subnet it names (found
// false: EC2 does not know it) and the node: the subnet must exist and be in
// the node's zone and VPC, every security group must look like a group ID.
// It returns nil or an error wrapping ErrInvalidENIConfig that says what to
// fix.
func CheckENIConfig(c ENIConfig, s provider.Subnet, found bool, self provider.Instance) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: ENIConfig %q: %s", ErrInvalidENIConfig, c.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Subnet == "":
		return bad("spec.subnet is empty")
	case !found:
		return bad("subnet %s does not exist", c.Subnet)
	case s.AvailabilityZone != self.AvailabilityZone:
		return bad("subnet %s is in zone %s, the node in %s", c.Subnet, s.AvailabilityZone, self.AvailabilityZone)
	case self.VPCID != "" && s.VPCID != "" && s.VPCID != self.VPCID:
		return bad("subnet %s is in %s, the node in %s", c.Subnet, s.VPCID, self.VPCID)
	}
	for _, g := range c.SecurityGroups {
		if !strings.HasPrefix(g, "sg-") {
			return bad("security group %q is not a group ID (sg-...)", g)
		}
	}
	return nil
}
