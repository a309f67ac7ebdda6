package ipamd

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/hostnet"
)

// imdsAllowed is the allowed address set the host's filter holds; ok false
// when no filter is applied.
func (h *memHost) imdsAllowed() (map[netip.Addr]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.imds == nil {
		return nil, false
	}
	out := map[netip.Addr]string{}
	for _, a := range h.imds.Allowed {
		out[a.Addr] = a.Pod
	}
	return out, true
}

func addIn(t *testing.T, n *node, namespace, c string) api.Assignment {
	t.Helper()
	a, err := n.client.Assign(context.Background(), api.AssignRequest{Key: key(c), Pod: api.Pod{Namespace: namespace, Name: "p-" + c}})
	if err != nil {
		t.Fatalf("ADD(%s/%s): %v", namespace, c, err)
	}
	return a
}

// The filter is in place when the daemon is ready; an ADD of a pod in an
// allowed namespace is answered only once its address is allowed, a pod
// elsewhere never is, and DEL takes the allowance away before the address
// can go to another pod.
func TestIMDSFilterFollowsAssignments(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "3", "VPCIP_IMDS_ALLOW_NAMESPACES": "kube-system"})
	n.host = host
	n.start()
	check := func(step string, want map[netip.Addr]string) {
		t.Helper()
		got, ok := host.imdsAllowed()
		if !ok {
			t.Fatalf("%s: no IMDS filter applied", step)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: allowed (-want +got):\n%s", step, d)
		}
	}
	check("ready", map[netip.Addr]string{})
	blocked := addIn(t, n, "default", "c1")
	check("pod in default", map[netip.Addr]string{})
	allowed := addIn(t, n, "kube-system", "c2")
	check("pod in kube-system", map[netip.Addr]string{allowed.Address: "kube-system/p-c2"})
	n.reconcile()
	check("after reconcile", map[netip.Addr]string{allowed.Address: "kube-system/p-c2"})
	n.del("c2")
	check("after DEL", map[netip.Addr]string{})
	n.del("c1")
	_ = blocked
	if h := host.imds; h.VethPrefix != "eni" {
		t.Errorf("veth prefix %q, want eni", h.VethPrefix)
	}
}

// VPCIP_IMDS_POD_ACCESS=all removes the filter an earlier configuration
// left.
func TestIMDSFilterAllRemovesIt(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	host.imds = &hostnet.IMDSConfig{VethPrefix: "eni"}
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "3", "VPCIP_IMDS_POD_ACCESS": "all"})
	n.host = host
	n.start()
	addIn(t, n, "default", "c1")
	if _, ok := host.imdsAllowed(); ok {
		t.Error("IMDS filter still applied with VPCIP_IMDS_POD_ACCESS=all")
	}
}

// In IPv6 mode the filter covers IMDS's IPv6 address too (IMDSConfig.IPv6),
// and an allowed pod is named by its IPv6 address and its host veth (the
// IPv4 egress packets it sends to 169.254.169.254 carry a host-local
// address the daemon does not know).
func TestIMDSFilterIPv6Mode(t *testing.T) {
	c := startCloud(t)
	host := newMemHost()
	env := ipv6Env()
	env["VPCIP_IMDS_ALLOW_NAMESPACES"] = "kube-system"
	n := newNode(t, c, itypeSmall, env)
	n.host = host
	n.start()
	addIn(t, n, "default", "c1")
	allowed := addIn(t, n, "kube-system", "c2")
	host.mu.Lock()
	got := *host.imds
	host.mu.Unlock()
	want := hostnet.IMDSConfig{VethPrefix: "eni", IPv6: true, Allowed: []hostnet.IMDSAllowed{
		{Addr: allowed.Address, Pod: "kube-system/p-c2", Veth: datapath.HostVethName("eni", "kube-system", "p-c2", "c2")}}}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" || !allowed.Address.Is6() {
		t.Errorf("IMDS filter of an IPv6 node (-want +got):\n%s", d)
	}
}
