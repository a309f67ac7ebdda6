package hostnet

import (
	"errors"
	"fmt"
	"github.com/vpcip/vpcip/routing"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// A small VPC in namespaces, wired as docs/design.md §4 describes:
//
//	pod A (10.0.0.50, primary ENI) ─┐            ┌─ r0 10.0.0.1/24 ─┐
//	                                ├─ node ─ eth0 10.0.0.10 ─┘       ├─ router: 192.0.2.10 (outside the VPC)
//	pod B (10.0.1.50, ENI B)       ─┘       eth1 ENI B (10.0.1.10) ─ r1 10.0.1.1/24 ─┘
//
// The router runs strict rp_filter on r0 and r1, playing the VPC's
// source/destination check: a packet whose source belongs to the other
// ENI's side is dropped. No namespace has a link outside the test.
type vpc struct {
	node, router, podA, podB *testNS
}

const (
	vpcCIDR     = "10.0.0.0/16"
	nodeIP      = "10.0.0.10"
	podA        = "10.0.0.50"
	podB        = "10.0.1.50"
	outsideIP   = "192.0.2.10"
	routerVPCIP = "10.0.0.1"
	eniBMAC     = "0a:00:00:00:01:01"
)

func newVPC(t *testing.T) *vpc {
	needIptables(t)
	v := &vpc{node: newNS(t, "node"), router: newNS(t, "rtr"), podA: newNS(t, "poda"), podB: newNS(t, "podb")}
	n, r := v.node, v.router
	n.run(t, "ip", "link", "add", "eth0", "address", "0a:00:00:00:00:01", "type", "veth", "peer", "name", "r0", "netns", r.name)
	n.run(t, "ip", "link", "add", "eth1", "address", eniBMAC, "type", "veth", "peer", "name", "r1", "netns", r.name)
	n.run(t, "ip", "addr", "add", nodeIP+"/24", "dev", "eth0")
	n.run(t, "ip", "link", "set", "eth0", "up")
	n.run(t, "ip", "route", "add", "192.0.2.0/24", "via", routerVPCIP) // the node's way out of the VPC, by its primary ENI
	n.run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1")

	r.run(t, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1")
	r.run(t, "ip", "addr", "add", routerVPCIP+"/24", "dev", "r0")
	r.run(t, "ip", "addr", "add", "10.0.1.1/24", "dev", "r1")
	r.run(t, "ip", "addr", "add", outsideIP+"/32", "dev", "lo")
	for _, l := range []string{"r0", "r1"} {
		r.run(t, "ip", "link", "set", l, "up")
		r.run(t, "sysctl", "-qw", "net.ipv4.conf."+l+".rp_filter=1")
	}
	// The VPC delivers each pod address to the ENI that holds it.
	r.run(t, "ip", "route", "add", podA+"/32", "via", nodeIP, "dev", "r0")
	r.run(t, "ip", "route", "add", podB+"/32", "via", "10.0.1.10", "dev", "r1")

	v.addPod(t, v.podA, "enipoda", podA, 0)
	v.addPod(t, v.podB, "enipodb", podB, 1)
	return v
}

// addPod wires a pod netns the way the plugin does (docs/design.md §4).
func (v *vpc) addPod(t *testing.T, pod *testNS, hostVeth, ip string, device int) {
	n := v.node
	n.run(t, "ip", "link", "add", hostVeth, "type", "veth", "peer", "name", "eth0", "netns", pod.name)
	n.run(t, "ip", "link", "set", hostVeth, "up")
	mac := strings.Fields(n.run(t, "cat", "/sys/class/net/"+hostVeth+"/address"))[0]
	pod.run(t, "ip", "addr", "add", ip+"/32", "dev", "eth0")
	pod.run(t, "ip", "link", "set", "eth0", "up")
	pod.run(t, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	for _, dst := range []string{vpcCIDR, "192.0.2.0/24"} {
		pod.run(t, "ip", "route", "add", dst, "via", "169.254.1.1", "dev", "eth0")
	}
	pod.run(t, "ip", "neigh", "add", "169.254.1.1", "lladdr", mac, "dev", "eth0", "nud", "permanent")
	n.run(t, "ip", "route", "add", ip+"/32", "dev", hostVeth, "scope", "link")
	n.run(t, "ip", "rule", "add", "to", ip+"/32", "lookup", "main", "priority", fmt.Sprint(routing.PriorityToPod))
	if device > 0 {
		n.run(t, "ip", "rule", "add", "from", ip+"/32", "lookup", fmt.Sprint(routing.TableForDevice(device)), "priority", fmt.Sprint(routing.PriorityFromPod))
	}
}

// echo serves UDP on addr inside n until the test ends: every datagram is
// answered with the source address the server saw.
func echo(t *testing.T, n *testNS, addr string) {
	t.Helper()
	var conn *net.UDPConn
	n.do(t, func() (err error) {
		conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		return err
	})
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			conn.WriteToUDPAddrPort([]byte(from.Addr().String()), from)
		}
	}()
}

// ask sends one datagram from n to dst, on a fresh socket (a new
// connection for conntrack), and returns the source address the server
// saw. A lost datagram (ARP not resolved yet) is sent again, up to 3 times.
func ask(t *testing.T, n *testNS, dst string) (string, error) {
	t.Helper()
	var seen string
	var lastErr error
	n.do(t, func() error {
		conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst)))
		if err != nil {
			return err
		}
		defer conn.Close()
		buf := make([]byte, 64)
		for range 3 {
			if _, err := conn.Write([]byte("who am I")); err != nil {
				lastErr = err
				continue
			}
			conn.SetReadDeadline(time.Now().Add(time.Second))
			k, err := conn.Read(buf)
			if err == nil {
				seen = string(buf[:k])
				return nil
			}
			lastErr = err
		}
		return nil
	})
	if seen == "" {
		return "", fmt.Errorf("no answer from %s: %w", dst, errors.Join(lastErr))
	}
	return seen, nil
}

func (v *vpc) snatConfig() SNATConfig {
	return SNATConfig{
		VPCCIDRs:    []netip.Prefix{netip.MustParsePrefix(vpcCIDR)},
		PrimaryIP:   netip.MustParseAddr(nodeIP),
		PrimaryLink: "eth0",
		Ports:       SNATPortsRandomFully,
	}
}

// expectSource asks from pod to dst and checks the source the server saw.
func expectSource(t *testing.T, from *testNS, dst, want string) {
	t.Helper()
	got, err := ask(t, from, dst)
	if err != nil {
		t.Errorf("%s -> %s: %v (want it seen from %s)", from.name, dst, err, want)
		return
	}
	if got != want {
		t.Errorf("%s -> %s: seen from %s, want %s", from.name, dst, got, want)
	}
}

// B17: pods on the primary and on a secondary ENI reach a destination
// outside the VPC as the node's primary address, leaving by the primary
// ENI; traffic inside the VPC keeps the pod address; with external SNAT
// the pod address goes out unchanged by the pod's own ENI, and so it does to
// an excluded CIDR.
func TestTrafficSNAT(t *testing.T) {
	v := newVPC(t)
	echo(t, v.router, outsideIP+":7007")
	echo(t, v.router, routerVPCIP+":7007")
	eniB := ENI{MAC: eniBMAC, DeviceNumber: 1, PrimaryIP: netip.MustParseAddr("10.0.1.10"),
		SubnetCIDR: netip.MustParsePrefix("10.0.1.0/24"), Gateway: netip.MustParseAddr("10.0.1.1"), MTU: 1500}
	v.node.do(t, func() error { _, err := EnsureENI(eniB); return err })

	// Before SNAT: every pod is seen with its own address.
	expectSource(t, v.podA, outsideIP+":7007", podA)
	expectSource(t, v.podB, outsideIP+":7007", podB)

	c := v.snatConfig()
	v.node.do(t, func() error { return EnsureSNAT(c) })
	expectSource(t, v.podA, outsideIP+":7007", nodeIP)
	// Pod B's packet must leave by eth0: by eth1 the router's strict
	// rp_filter (the VPC's source/destination check) drops 10.0.0.10.
	expectSource(t, v.podB, outsideIP+":7007", nodeIP)
	expectSource(t, v.podA, routerVPCIP+":7007", podA)
	expectSource(t, v.podB, routerVPCIP+":7007", podB)

	c.External = true
	v.node.do(t, func() error { return EnsureSNAT(c) })
	expectSource(t, v.podA, outsideIP+":7007", podA)
	expectSource(t, v.podB, outsideIP+":7007", podB)

	c.External = false
	v.node.do(t, func() error { return EnsureSNAT(c) })
	expectSource(t, v.podB, outsideIP+":7007", nodeIP)

	// AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS: an excluded destination sees pods
	// as themselves, each by its own ENI.
	c.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	v.node.do(t, func() error { return EnsureSNAT(c) })
	expectSource(t, v.podA, outsideIP+":7007", podA)
	expectSource(t, v.podB, outsideIP+":7007", podB)
}

// B15: a NodePort connection entering by the primary ENI and DNATed to a
// pod on a secondary ENI is answered by the primary ENI, with strict
// rp_filter as the distribution default on the node, with node SNAT and
// with external SNAT alike.
func TestTrafficNodePortToSecondaryENIPod(t *testing.T) {
	v := newVPC(t)
	echo(t, v.podB, podB+":8080")
	eniB := ENI{MAC: eniBMAC, DeviceNumber: 1, PrimaryIP: netip.MustParseAddr("10.0.1.10"),
		SubnetCIDR: netip.MustParsePrefix("10.0.1.0/24"), Gateway: netip.MustParseAddr("10.0.1.1"), MTU: 1500}
	v.node.do(t, func() error { _, err := EnsureENI(eniB); return err })
	// What kube-proxy would install for a NodePort service.
	v.node.run(t, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-d", nodeIP, "-p", "udp", "--dport", "30080",
		"-j", "DNAT", "--to-destination", podB+":8080")

	// Without our marks the reply leaves by eth1 and is dropped.
	if got, err := ask(t, v.router, nodeIP+":30080"); err == nil {
		t.Fatalf("NodePort answered (seen from %s) before EnsureSNAT; the test topology does not check the reply path", got)
	}
	for _, external := range []bool{false, true} {
		c := v.snatConfig()
		c.External = external
		v.node.do(t, func() error { return EnsureSNAT(c) })
		// The pod sees the client; the client gets the answer from the node.
		expectSource(t, v.router, nodeIP+":30080", routerVPCIP)
	}
}
