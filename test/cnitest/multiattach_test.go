package cnitest

import (
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/routing"
)

// TestTwoAttachmentsInOnePod: a pod attached to the network twice (Multus
// adding "net1" beside the cluster network's "eth0", through the same
// vpcip network) gets two host veths, two addresses, two routes and their
// rules; neither ADD replaces the other's veth, its address or, inside the
// pod, eth0's default route; the DEL of one leaves the other wired and held. The host veth name
// derives from the attachment (docs/design.md §4), not from the pod alone.
func TestTwoAttachmentsInOnePod(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool(4))
	e.Chain = false
	eth0 := e.NewPod(t, "multi")
	e.MustAdd(t, eth0)
	net1 := *eth0
	net1.IfName, net1.Result, net1.Address = "net1", nil, netip.Addr{}
	e.MustAdd(t, &net1)
	if net1.Address == eth0.Address {
		t.Fatalf("both attachments got %v", eth0.Address)
	}
	devs := map[string]string{}
	for _, p := range []*Pod{eth0, &net1} {
		a := mustHeld(t, e, p)
		r, ok := HostRoute(t, e.Node.Name, p.Address)
		if !ok {
			t.Fatalf("%s: no host route to %v", p.IfName, p.Address)
		}
		devs[p.IfName] = r.Dev
		if want := e.HostVeth(p); r.Dev != want {
			t.Errorf("%s: host route to %v via %s, want its own veth %s", p.IfName, p.Address, r.Dev, want)
		}
		if got, want := PodRules(t, e.Node.Name, p.Address), WantRules(p.Address, a.RouteTable); !slices.Equal(got, want) {
			t.Errorf("%s: rules %v, want %v", p.IfName, got, want)
		}
		if l, ok := linkNamed(t, e.Node.Name, r.Dev); !ok || l.IfAlias != routing.SandboxAlias(Network, p.ContainerID, p.IfName) {
			t.Errorf("%s: host veth %s alias %q, want its attachment's", p.IfName, r.Dev, l.IfAlias)
		}
	}
	if devs["eth0"] == devs["net1"] {
		t.Fatalf("both attachments routed via one host veth %s", devs["eth0"])
	}
	// Inside the pod, net1 is routed by source: the default route stays
	// on eth0 though net1 was wired last (docs/design.md §4).
	for from, want := range map[string]string{"": "eth0", eth0.Address.String(): "eth0", net1.Address.String(): "net1"} {
		args := []string{"-n", eth0.NetnsName, "-o", "route", "get", "198.51.100.7"}
		if from != "" {
			args = append(args, "from", from)
		}
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), " dev "+want+" ") {
			t.Errorf("in the pod, ip %s: %s (%v); want it to leave by %s", strings.Join(args[2:], " "), out, err, want)
		}
	}
	mustDel(t, e, &net1)
	a := mustHeld(t, e, eth0)
	if r, ok := HostRoute(t, e.Node.Name, eth0.Address); !ok || r.Dev != devs["eth0"] {
		t.Errorf("eth0 after net1's DEL: host route %+v (%v), want via %s", r, ok, devs["eth0"])
	}
	if got, want := PodRules(t, e.Node.Name, eth0.Address), WantRules(eth0.Address, a.RouteTable); !slices.Equal(got, want) {
		t.Errorf("eth0 after net1's DEL: rules %v, want %v", got, want)
	}
	mustDel(t, e, eth0)
	AssertNodeClean(t, e)
}

// TestAttachmentVethNamedTheOldWay: an attachment beside the default one
// that an older plugin wired has its pod's default host veth name (here a
// pod attached to the vpcip network only as net1, whose cluster network is
// another plugin's). After an upgrade CHECK still finds it, and DEL removes
// its veth, route and rules and releases its address.
func TestAttachmentVethNamedTheOldWay(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool(4))
	e.Chain = false
	p := e.NewPod(t, "oldname")
	p.IfName = "net1"
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	legacy := datapath.HostVethName(e.VethPrefix, p.Namespace, p.Name, p.ContainerID)
	if legacy == e.HostVeth(p) {
		t.Fatalf("setup: net1's veth %s has the pod's default name", legacy)
	}
	ipCmd(t, "-n", e.Node.Name, "link", "set", "dev", e.HostVeth(p), "down")
	ipCmd(t, "-n", e.Node.Name, "link", "set", "dev", e.HostVeth(p), "name", legacy)
	ipCmd(t, "-n", e.Node.Name, "link", "set", "dev", legacy, "up")
	ipCmd(t, "-n", e.Node.Name, "route", "replace", a.Address.String()+"/32", "dev", legacy, "scope", "link") // went with the link's down
	if r, ok := HostRoute(t, e.Node.Name, a.Address); !ok || r.Dev != legacy {
		t.Fatalf("setup: host route %+v (%v), want via %s", r, ok, legacy)
	}
	if err := e.Check(t, p); err != nil {
		t.Errorf("CHECK of an attachment whose veth has the old name: %v", err)
	}
	mustDel(t, e, p)
	if _, ok := e.Held(t, p); ok {
		t.Errorf("%v still held after DEL", a.Address)
	}
	if _, ok := linkNamed(t, e.Node.Name, legacy); ok {
		t.Errorf("host veth %s left after DEL", legacy)
	}
	AssertHostSideGone(t, e, p, a.Address)
	AssertNodeClean(t, e)
}
