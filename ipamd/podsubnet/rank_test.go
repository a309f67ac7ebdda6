package podsubnet

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/provider"
)

func sub(id, zone string, free int, tags ...string) provider.Subnet {
	s := provider.Subnet{ID: id, VPCID: "vpc-1", CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: zone, FreeAddresses: free, Tags: map[string]string{}}
	for _, kv := range tags {
		k, v, _ := strings.Cut(kv, "=")
		s.Tags[k] = v
	}
	return s
}

func TestRank(t *testing.T) {
	const node, zone = "subnet-node", "us-west-2a"
	tests := []struct {
		name    string
		subnets []provider.Subnet
		want    []string // "id:eligible:why" in order
	}{
		{"node subnet alone", []provider.Subnet{sub(node, zone, 10)},
			[]string{"subnet-node:true:node subnet"}},
		{"tagged subnet with more free goes first", []provider.Subnet{sub(node, zone, 10), sub("subnet-pods", zone, 4000, "kubernetes.io/role/cni=1")},
			[]string{"subnet-pods:true:tagged kubernetes.io/role/cni", "subnet-node:true:node subnet"}},
		{"an empty tag value counts as tagged", []provider.Subnet{sub(node, zone, 10), sub("subnet-pods", zone, 40, "kubernetes.io/role/cni=")},
			[]string{"subnet-pods:true:tagged kubernetes.io/role/cni", "subnet-node:true:node subnet"}},
		{"node subnet wins a tie", []provider.Subnet{sub("subnet-a", zone, 10, "kubernetes.io/role/cni=1"), sub(node, zone, 10)},
			[]string{"subnet-node:true:node subnet", "subnet-a:true:tagged kubernetes.io/role/cni"}},
		{"untagged subnets are never used", []provider.Subnet{sub(node, zone, 10), sub("subnet-other", zone, 4000)},
			[]string{"subnet-node:true:node subnet", "subnet-other:false:not tagged kubernetes.io/role/cni"}},
		{"cni=0 excludes the node subnet too", []provider.Subnet{sub(node, zone, 10, "kubernetes.io/role/cni=0"), sub("subnet-off", zone, 4000, "kubernetes.io/role/cni=0"), sub("subnet-pods", zone, 5, "kubernetes.io/role/cni=1")},
			[]string{"subnet-pods:true:tagged kubernetes.io/role/cni", "subnet-node:false:tagged kubernetes.io/role/cni=0", "subnet-off:false:tagged kubernetes.io/role/cni=0"}},
		{"another zone is skipped", []provider.Subnet{sub(node, zone, 10), sub("subnet-b", "us-west-2b", 4000, "kubernetes.io/role/cni=1")},
			[]string{"subnet-node:true:node subnet", "subnet-b:false:in zone us-west-2b, not the node's us-west-2a"}},
		{"another cluster's subnet is skipped", []provider.Subnet{sub(node, zone, 10), sub("subnet-x", zone, 4000, "kubernetes.io/role/cni=1", "kubernetes.io/cluster/other=shared")},
			[]string{"subnet-node:true:node subnet", "subnet-x:false:tagged for cluster other, not blue"}},
		{"a subnet shared with this cluster is used", []provider.Subnet{sub(node, zone, 10), sub("subnet-x", zone, 4000, "kubernetes.io/role/cni=1", "kubernetes.io/cluster/other=shared", "kubernetes.io/cluster/blue=owned")},
			[]string{"subnet-x:true:tagged kubernetes.io/role/cni", "subnet-node:true:node subnet"}},
		{"a full subnet is skipped", []provider.Subnet{sub(node, zone, 0), sub("subnet-pods", zone, 0, "kubernetes.io/role/cni=1")},
			[]string{"subnet-node:false:no free address", "subnet-pods:false:no free address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range Rank(RankInput{NodeSubnet: node, Zone: zone, VPCID: "vpc-1", Cluster: "blue", Subnets: tt.subnets}) {
				got = append(got, c.Subnet.ID+":"+map[bool]string{true: "true", false: "false"}[c.Eligible]+":"+c.Why)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Rank (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigName(t *testing.T) {
	zoneKeys := NodeKeys{Label: "topology.kubernetes.io/zone"}
	tests := []struct {
		name          string
		labels, annot map[string]string
		keys          NodeKeys
		want, source  string
	}{
		{"nothing: default", nil, nil, NodeKeys{}, "default", "no label or annotation names one"},
		{"default label key", map[string]string{"k8s.amazonaws.com/eniConfig": "pods-a"}, nil, NodeKeys{}, "pods-a", "label k8s.amazonaws.com/eniConfig"},
		{"annotation before label", map[string]string{"k8s.amazonaws.com/eniConfig": "by-label"}, map[string]string{"k8s.amazonaws.com/eniConfig": "by-annotation"}, NodeKeys{}, "by-annotation", "annotation k8s.amazonaws.com/eniConfig"},
		{"external label first", map[string]string{"vpc.amazonaws.com/externalEniConfig": "ext", "k8s.amazonaws.com/eniConfig": "by-label"}, map[string]string{"k8s.amazonaws.com/eniConfig": "by-annotation"}, NodeKeys{}, "ext", "label vpc.amazonaws.com/externalEniConfig"},
		{"one ENIConfig per zone", map[string]string{"topology.kubernetes.io/zone": "us-west-2b"}, nil, zoneKeys, "us-west-2b", "label topology.kubernetes.io/zone"},
		{"custom annotation key", nil, map[string]string{"example.com/eni": "x"}, NodeKeys{Annotation: "example.com/eni"}, "x", "annotation example.com/eni"},
		{"empty values are skipped", map[string]string{"vpc.amazonaws.com/externalEniConfig": ""}, map[string]string{"k8s.amazonaws.com/eniConfig": ""}, NodeKeys{}, "default", "no label or annotation names one"},
	}
	for _, tt := range tests {
		name, source := ConfigName(tt.labels, tt.annot, tt.keys)
		if name != tt.want || source != tt.source {
			t.Errorf("%s: ConfigName = %q (%s), want %q (%s)", tt.name, name, source, tt.want, tt.source)
		}
	}
}

func TestCheckENIConfig(t *testing.T) {
	self := provider.Instance{AvailabilityZone: "us-west-2a", VPCID: "vpc-1"}
	good := sub("subnet-pods", "us-west-2a", 100)
	tests := []struct {
		name  string
		cfg   ENIConfig
		s     provider.Subnet
		found bool
		want  string // "" = valid, else a fragment of the error
	}{
		{"valid", ENIConfig{Name: "a", Subnet: "subnet-pods", SecurityGroups: []string{"sg-1"}}, good, true, ""},
		{"valid without groups", ENIConfig{Name: "a", Subnet: "subnet-pods"}, good, true, ""},
		{"no subnet", ENIConfig{Name: "a"}, provider.Subnet{}, false, "spec.subnet is empty"},
		{"unknown subnet", ENIConfig{Name: "a", Subnet: "subnet-gone"}, provider.Subnet{}, false, "subnet subnet-gone does not exist"},
		{"other zone", ENIConfig{Name: "a", Subnet: "subnet-b"}, sub("subnet-b", "us-west-2b", 9), true, "is in zone us-west-2b, the node in us-west-2a"},
		{"other VPC", ENIConfig{Name: "a", Subnet: "subnet-pods"}, func() provider.Subnet { s := good; s.VPCID = "vpc-2"; return s }(), true, "is in vpc-2"},
		{"bad group", ENIConfig{Name: "a", Subnet: "subnet-pods", SecurityGroups: []string{"default"}}, good, true, `security group "default" is not a group ID`},
	}
	for _, tt := range tests {
		err := CheckENIConfig(tt.cfg, tt.s, tt.found, self)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: err = %v, want one saying %q", tt.name, err, tt.want)
		}
	}
}
