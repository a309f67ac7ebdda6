package hostnet

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/google/go-cmp/cmp"
)

func TestIMDSRulesSpec(t *testing.T) {
	chain, jumps := imdsRules(IMDSConfig{VethPrefix: "eni", Allowed: []IMDSAllowed{
		{Addr: netip.MustParseAddr("10.0.1.50"), Pod: "b/x"},
		{Addr: netip.MustParseAddr("10.0.0.9"), Pod: `a/"q"`},
		{Addr: netip.MustParseAddr("10.0.1.50"), Pod: "b/x"},
	}})
	var got []string
	for _, r := range append(chain, jumps...) {
		got = append(got, r.chain+" "+strings.Join(r.args(), " "))
	}
	got = stripIDs(got)
	want := []string{
		`VPCIP-IMDS -s 10.0.0.9/32 -m comment --comment vpcip:ID pod a/_q_ may reach IMDS -j RETURN`,
		`VPCIP-IMDS -s 10.0.1.50/32 -m comment --comment vpcip:ID pod b/x may reach IMDS -j RETURN`,
		`VPCIP-IMDS -i eni+ -m comment --comment vpcip:ID pods may not reach IMDS -j REJECT --reject-with icmp-port-unreachable`,
		`FORWARD -d 169.254.169.254/32 -m comment --comment vpcip:ID vpcip pod access to IMDS -j VPCIP-IMDS`,
		`INPUT -d 169.254.169.254/32 -m comment --comment vpcip:ID vpcip pod access to IMDS -j VPCIP-IMDS`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rules (-want +got):\n%s", d)
	}
	for _, bad := range []IMDSConfig{{VethPrefix: ""}, {VethPrefix: "a+"}, {VethPrefix: "eni", Allowed: []IMDSAllowed{{Pod: "x"}}}} {
		if err := bad.validate(); err == nil {
			t.Errorf("validate(%+v) = nil, want an error", bad)
		}
	}
}

// IPv6 mode: the IPv4 chain lets allowed pods' egress through by host
// veth, the ip6tables chain by IPv6 address, for fd00:ec2::254; an IPv4
// address, or an IPv6 one without its veth, is refused.
func TestIMDSRulesSpecIPv6(t *testing.T) {
	c := IMDSConfig{VethPrefix: "eni", IPv6: true, Allowed: []IMDSAllowed{
		{Addr: netip.MustParseAddr("2600:1f14::5"), Pod: "kube-system/x", Veth: "eni0123456789a"},
	}}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range []func(IMDSConfig) ([]rule, []rule){imdsRules, imdsRules6} {
		chain, jumps := f(c)
		for _, r := range append(chain, jumps...) {
			got = append(got, r.chain+" "+strings.Join(r.args(), " "))
		}
	}
	want := []string{
		`VPCIP-IMDS -i eni0123456789a -m comment --comment vpcip:ID pod kube-system/x may reach IMDS -j RETURN`,
		`VPCIP-IMDS -i eni+ -m comment --comment vpcip:ID pods may not reach IMDS -j REJECT --reject-with icmp-port-unreachable`,
		`FORWARD -d 169.254.169.254/32 -m comment --comment vpcip:ID vpcip pod access to IMDS -j VPCIP-IMDS`,
		`INPUT -d 169.254.169.254/32 -m comment --comment vpcip:ID vpcip pod access to IMDS -j VPCIP-IMDS`,
		`VPCIP-IMDS -s 2600:1f14::5/128 -m comment --comment vpcip:ID pod kube-system/x may reach IMDS -j RETURN`,
		`VPCIP-IMDS -i eni+ -m comment --comment vpcip:ID pods may not reach IMDS -j REJECT --reject-with icmp6-port-unreachable`,
		`FORWARD -d fd00:ec2::254/128 -m comment --comment vpcip:ID vpcip pod access to IMDS -j VPCIP-IMDS`,
		`INPUT -d fd00:ec2::254/128 -m comment --comment vpcip:ID vpcip pod access to IMDS -j VPCIP-IMDS`,
	}
	if d := cmp.Diff(want, stripIDs(got)); d != "" {
		t.Errorf("rules (-want +got):\n%s", d)
	}
	for _, bad := range []IMDSConfig{
		{VethPrefix: "eni", IPv6: true, Allowed: []IMDSAllowed{{Addr: netip.MustParseAddr("10.0.0.9"), Veth: "eni1"}}},
		{VethPrefix: "eni", IPv6: true, Allowed: []IMDSAllowed{{Addr: netip.MustParseAddr("2600:1f14::5")}}},
		{VethPrefix: "eni", Allowed: []IMDSAllowed{{Addr: netip.MustParseAddr("2600:1f14::5"), Veth: "eni1"}}},
	} {
		if err := bad.validate(); err == nil {
			t.Errorf("validate(%+v) = nil, want an error", bad)
		}
	}
}

func stripIDs(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = idPattern.ReplaceAllString(l, "vpcip:ID")
	}
	return out
}

// serveTCP accepts on addr (network "tcp4" or "tcp6") inside n until the
// test ends and writes "ok" on every connection.
func serveTCP(t *testing.T, n *testNS, network, addr string) {
	t.Helper()
	var l net.Listener
	n.do(t, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
}

// dialIMDS connects from n to IMDS port 80 (2 s bound) and reads the
// answer: nil when "ok" came back.
func dialIMDS(t *testing.T, n *testNS) error {
	t.Helper()
	var got error
	n.do(t, func() error {
		c, err := net.DialTimeout("tcp4", "169.254.169.254:80", 2*time.Second)
		if err != nil {
			got = err
			return nil
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(c)
		if err == nil && string(b) != "ok" {
			err = errors.New("answer " + string(b))
		}
		got = err
		return nil
	})
	return got
}

func expectIMDS(t *testing.T, n *testNS, reachable bool) {
	t.Helper()
	err := dialIMDS(t, n)
	switch {
	case reachable && err != nil:
		t.Errorf("%s -> IMDS: %v, want it reached", n.name, err)
	case !reachable && err == nil:
		t.Errorf("%s -> IMDS: reached, want it refused", n.name)
	case !reachable && !errors.Is(err, syscall.ECONNREFUSED):
		t.Errorf("%s -> IMDS: %v, want connection refused", n.name, err)
	}
}

// Pods reach IMDS only when allowed, both where IMDS is behind the ENI (EC2:
// FORWARD) and where it listens in the node's netns (vpcsim: INPUT); the
// node itself always does, pods' other traffic is untouched, and
// RemoveIMDSBlock leaves no rule behind.
func TestTrafficIMDSBlock(t *testing.T) {
	for _, where := range []string{"forwarded", "local"} {
		t.Run(where, func(t *testing.T) {
			v := newVPC(t)
			echo(t, v.router, outsideIP+":7007")
			// As on a node: pod B on a secondary ENI, pods' traffic leaving
			// the VPC (IMDS's address included) SNATed by the primary ENI.
			eniB := ENI{MAC: eniBMAC, DeviceNumber: 1, PrimaryIP: netip.MustParseAddr("10.0.1.10"),
				SubnetCIDR: netip.MustParsePrefix("10.0.1.0/24"), Gateway: netip.MustParseAddr("10.0.1.1"), MTU: 1500}
			v.node.do(t, func() error { _, err := EnsureENI(eniB); return err })
			v.node.do(t, func() error { return EnsureSNAT(v.snatConfig()) })
			for _, p := range []*testNS{v.podA, v.podB} {
				p.run(t, "ip", "route", "add", IMDSAddr.String(), "via", "169.254.1.1", "dev", "eth0")
			}
			if where == "forwarded" {
				v.router.run(t, "ip", "addr", "add", IMDSAddr.String()+"/32", "dev", "lo")
				v.node.run(t, "ip", "route", "add", IMDSAddr.String(), "via", routerVPCIP)
				serveTCP(t, v.router, "tcp4", IMDSAddr.String()+":80")
			} else {
				v.node.run(t, "ip", "addr", "add", IMDSAddr.String()+"/32", "dev", "lo")
				serveTCP(t, v.node, "tcp4", IMDSAddr.String()+":80")
			}
			expectIMDS(t, v.podA, true) // the topology passes pods' packets before the block
			expectIMDS(t, v.podB, true)

			c := IMDSConfig{VethPrefix: "eni", Allowed: []IMDSAllowed{{Addr: netip.MustParseAddr(podB), Pod: "ns/b"}}}
			for range 2 { // converging twice changes nothing
				v.node.do(t, func() error { return EnsureIMDSBlock(c) })
			}
			if got := v.node.iptRules(t, "filter"); len(got) != 4 {
				t.Errorf("filter rules after two Ensure runs: %q, want 2 jumps and 2 chain rules", got)
			}
			expectIMDS(t, v.podA, false)
			expectIMDS(t, v.podB, true)
			expectIMDS(t, v.node, true)
			expectSource(t, v.podA, outsideIP+":7007", nodeIP)
			expectSource(t, v.podB, outsideIP+":7007", nodeIP)

			c.Allowed = nil
			v.node.do(t, func() error { return EnsureIMDSBlock(c) })
			expectIMDS(t, v.podB, false)

			v.node.do(t, RemoveIMDSBlock)
			v.node.do(t, RemoveIMDSBlock) // gone is success
			if got := v.node.iptRules(t, "filter"); len(got) != 0 {
				t.Errorf("filter rules after RemoveIMDSBlock: %q, want none", got)
			}
			expectIMDS(t, v.podA, true)
		})
	}
}

// IPv6 mode, with real ip6tables and iptables in netns: a pod's IPv6
// connection to IMDS's fd00:ec2::254 (local to the node here, as on vpcsim:
// INPUT) is refused unless its address is allowed, and its IPv4 one to
// 169.254.169.254 (its egress address, which the daemon does not know)
// unless its host veth is; the node reaches both.
func TestTrafficIMDSBlockIPv6(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("ip6tables"); err != nil {
		t.Skip("needs ip6tables")
	}
	node := newNS(t, "n6")
	pod := newNS(t, "p6")
	node.run(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1")
	node.run(t, "ip", "link", "add", "eni6a", "type", "veth", "peer", "name", "eth0", "netns", pod.name)
	// No duplicate address detection: a tentative link-local address
	// answers no neighbour solicitation, and the pod's next hop is one.
	node.run(t, "sysctl", "-qw", "net.ipv6.conf.eni6a.accept_dad=0")
	pod.run(t, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0")
	node.run(t, "ip", "link", "set", "eni6a", "up")
	pod.run(t, "ip", "link", "set", "eth0", "up")
	podIP := netip.MustParseAddr("2600:1f14:0:1::9")
	pod.run(t, "ip", "-6", "addr", "add", podIP.String()+"/128", "dev", "eth0", "nodad")
	pod.run(t, "ip", "addr", "add", "169.254.172.9/32", "dev", "eth0")
	pod.run(t, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	pod.run(t, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
	node.run(t, "ip", "route", "add", "169.254.172.9/32", "dev", "eni6a", "scope", "link")
	var mac string
	node.do(t, func() error {
		l, err := netlinksafe.LinkByName("eni6a")
		if err == nil {
			mac = l.Attrs().HardwareAddr.String()
		}
		return err
	})
	pod.run(t, "ip", "neigh", "replace", "169.254.1.1", "lladdr", mac, "dev", "eth0", "nud", "permanent")
	// The pod's IPv6 default route via the host veth's link-local address.
	ll := ""
	for deadline := time.Now().Add(5 * time.Second); ll == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, l := range node.lines(t, "ip", "-6", "-o", "addr", "show", "dev", "eni6a", "scope", "link") {
			if f := strings.Fields(l); len(f) > 3 && !strings.Contains(l, "tentative") {
				ll = strings.Split(f[3], "/")[0]
			}
		}
	}
	if ll == "" {
		t.Fatal("host veth has no link-local address")
	}
	pod.run(t, "ip", "-6", "route", "add", "default", "via", ll, "dev", "eth0")
	node.run(t, "ip", "-6", "route", "add", podIP.String()+"/128", "dev", "eni6a")
	node.run(t, "ip", "-6", "addr", "add", IMDSAddr6.String()+"/128", "dev", "lo", "nodad")
	node.run(t, "ip", "addr", "add", IMDSAddr.String()+"/32", "dev", "lo")
	serveTCP(t, node, "tcp6", "["+IMDSAddr6.String()+"]:80")
	serveTCP(t, node, "tcp4", IMDSAddr.String()+":80")
	dial := func(n *testNS, hostport string) error {
		var got error
		n.do(t, func() error {
			c, err := net.DialTimeout("tcp", hostport, 2*time.Second)
			if err == nil {
				c.Close()
			}
			got = err
			return nil
		})
		return got
	}
	v6, v4 := "["+IMDSAddr6.String()+"]:80", IMDSAddr.String()+":80"
	for _, hp := range []string{v6, v4} {
		if err := dial(pod, hp); err != nil {
			t.Fatalf("pod -> %s before the block: %v (the topology must pass it)", hp, err)
		}
	}
	c := IMDSConfig{VethPrefix: "eni", IPv6: true}
	node.do(t, func() error { return EnsureIMDSBlock(c) })
	for _, hp := range []string{v6, v4} {
		if err := dial(pod, hp); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("pod -> %s blocked: %v, want connection refused", hp, err)
		}
		if err := dial(node, hp); err != nil {
			t.Errorf("node -> %s: %v, want it reached", hp, err)
		}
	}
	c.Allowed = []IMDSAllowed{{Addr: podIP, Pod: "kube-system/x", Veth: "eni6a"}}
	node.do(t, func() error { return EnsureIMDSBlock(c) })
	for _, hp := range []string{v6, v4} {
		if err := dial(pod, hp); err != nil {
			t.Errorf("allowed pod -> %s: %v, want it reached", hp, err)
		}
	}
	node.do(t, RemoveIMDSBlock)
	if got := node.lines(t, "ip6tables", "-w", "-S"); len(got) != 3 {
		t.Errorf("ip6tables after RemoveIMDSBlock: %q, want the three policies only", got)
	}
}
