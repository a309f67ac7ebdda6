package ipamd

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// fixedENIConfig is the node's ENIConfig as the Kubernetes part would supply it.
type fixedENIConfig podsubnet.ENIConfig

func (f fixedENIConfig) NodeENIConfig() (podsubnet.ENIConfig, string, error) {
	return podsubnet.ENIConfig(f), "label k8s.amazonaws.com/eniConfig", nil
}

// TestB19CustomNetworking: under custom networking the primary ENI holds no
// pod address, every pod address comes from ENIs in the ENIConfig's subnet,
// the budget is (ENIs − 1) × (addresses per ENI − 1) — 18 on a 3 × 10 type,
// the (3−1)×(10−1)+2 = 20 max pods less the 2 host-network pods — all 18 ADDs
// succeed, and the next fails at once naming the ENI limit.
func TestB19CustomNetworking(t *testing.T) {
	pods := netip.MustParsePrefix("100.64.16.0/20")
	c := startCloud(t,
		vpcsim.SubnetSpec{ID: "subnet-000000000000000a1", CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: "us-west-2a"},
		vpcsim.SubnetSpec{ID: "subnet-000000000000000a2", CIDR: pods, AvailabilityZone: "us-west-2a"})
	n := newNode(t, c, itypeSmall, map[string]string{"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "true", "VPCIP_ADD_WAIT": "10m"})
	n.wrap = func(p provider.Provider) provider.Provider {
		src := fixedENIConfig{Name: "pods", Subnet: "subnet-000000000000000a2"}
		return &podsubnet.Provider{Provider: p, Placer: podsubnet.NewPlacer(p, podsubnet.Settings{Custom: true}, src, nil, nil)}
	}
	n.start()
	for _, id := range names("c", 18) {
		if a := n.mustAdd(id); !pods.Contains(a.Address) {
			t.Errorf("ADD(%s) got %s, outside the ENIConfig's subnet %s", id, a.Address, pods)
		}
	}
	_, err := n.add("c18")
	var e *api.Error
	if !errors.As(err, &e) || e.Cause != api.CauseENILimit {
		t.Fatalf("19th ADD: %v, want no-address/eni-limit", err)
	}
	if want := "no free address: node at its ENI limit (2 of 2) and all 18 addresses assigned"; e.Message != want {
		t.Errorf("message %q, want %q", e.Message, want)
	}
	st := n.status()
	if st.Assigned != 18 || st.ENIs != 2 || st.MaxENIs != 2 || st.Budget != 18 || st.Capacity != 18 {
		t.Errorf("status %+v; want 18 assigned of a budget of 18 on 2 of 2 pod ENIs", st)
	}
	for _, eni := range c.Cloud.NetworkInterfaces() {
		if eni.InstanceID != n.inst.ID {
			continue
		}
		if eni.DeviceIndex == 0 && len(eni.SecondaryIPs)+len(eni.Prefixes) > 0 {
			t.Errorf("primary ENI holds %v %v", eni.SecondaryIPs, eni.Prefixes)
		}
		if eni.DeviceIndex > 0 && eni.SubnetID != "subnet-000000000000000a2" {
			t.Errorf("ENI %s in %s, want the ENIConfig's subnet", eni.ID, eni.SubnetID)
		}
	}
}
