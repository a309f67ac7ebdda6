// Package introspecttest holds a realistic introspection State for tests of
// the handler and of vpcipctl.
package introspecttest

import (
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/introspect"
)

// Sample is an m5.large node (3 ENIs, 10 IPv4 addresses per ENI, so 9 pod
// addresses per ENI and a budget of 27) with its primary ENI and one
// secondary ENI attached, three pods and one address in cooldown.
func Sample() introspect.State {
	at := func(h, m, s int) time.Time { return time.Date(2026, 11, 29, h, m, s, 0, time.UTC) }
	addrs := func(first string, n int) []netip.Addr {
		a := netip.MustParseAddr(first)
		out := make([]netip.Addr, n)
		for i := range out {
			out[i], a = a, a.Next()
		}
		return out
	}
	return introspect.State{
		Node: introspect.NodeInfo{
			Name:             "ip-100-64-0-10",
			InstanceID:       "i-0a1b2c3d4e5f60718",
			InstanceType:     "m5.large",
			AvailabilityZone: "us-west-2a",
			PrimaryIP:        netip.MustParseAddr("100.64.0.10"),
			Mode:             introspect.ModeSecondaryIP,
			Version:          "v0.1.0",
			StartedAt:        at(10, 58, 0),
		},
		Pool: api.Counts{Assigned: 3, Warm: 9, Cooling: 1, Capacity: 18, Budget: 27, ENIs: 2, MaxENIs: 3},
		ENIs: []introspect.ENI{
			{
				ID: "eni-0aaa1111bbbb2222c", MAC: "0a:58:64:40:00:0a", DeviceNumber: 0, RouteTable: 254, LinkName: "eth0",
				SubnetID: "subnet-0123abcd", SubnetCIDR: netip.MustParsePrefix("100.64.0.0/20"),
				PrimaryIP: netip.MustParseAddr("100.64.0.10"), Addresses: addrs("100.64.0.20", 9), Capacity: 9,
			},
			{
				ID: "eni-0ddd3333eeee4444f", MAC: "0a:58:64:40:10:05", DeviceNumber: 1, RouteTable: 2, LinkName: "eth1",
				SubnetID: "subnet-0456cdef", SubnetCIDR: netip.MustParsePrefix("100.64.16.0/20"),
				PrimaryIP: netip.MustParseAddr("100.64.16.5"), Addresses: addrs("100.64.16.10", 4), Capacity: 9,
			},
		},
		Assignments: []introspect.Assignment{
			{
				Key:     api.Key{Network: "vpcip", ContainerID: "3f9a1c2b7d6e5f4a3b2c1d0e9f8a7b6c", IfName: "eth0"},
				Pod:     api.Pod{Namespace: "default", Name: "web-7d4b9c6f5-x2x4q", UID: "6b1f3e0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"},
				Address: netip.MustParseAddr("100.64.0.20"), ENIID: "eni-0aaa1111bbbb2222c", AssignedAt: at(11, 0, 1),
			},
			{
				Key:     api.Key{Network: "vpcip", ContainerID: "8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a39", IfName: "eth0"},
				Pod:     api.Pod{Namespace: "kube-system", Name: "coredns-5d78c9869d-k8s2m", UID: "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b"},
				Address: netip.MustParseAddr("100.64.0.21"), ENIID: "eni-0aaa1111bbbb2222c", AssignedAt: at(10, 59, 30),
			},
			{
				Key:     api.Key{Network: "vpcip", ContainerID: "d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6", IfName: "eth0"},
				Pod:     api.Pod{Namespace: "batch", Name: "worker-0", UID: "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"},
				Address: netip.MustParseAddr("100.64.16.10"), ENIID: "eni-0ddd3333eeee4444f", AssignedAt: at(11, 2, 45),
			},
		},
		Cooling: []introspect.CoolingAddress{
			{Address: netip.MustParseAddr("100.64.0.22"), ENIID: "eni-0aaa1111bbbb2222c", UnassignedAt: at(11, 3, 10)},
		},
		Config: map[string]string{
			"WARM_ENI_TARGET":              "1",
			"WARM_IP_TARGET":               "",
			"MINIMUM_IP_TARGET":            "",
			"IP_COOLDOWN_PERIOD":           "30",
			"AWS_VPC_ENI_MTU":              "9001",
			"AWS_VPC_K8S_CNI_EXTERNALSNAT": "false",
		},
		Ready: true,
		Time:  at(11, 3, 20),
	}
}
