package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// IPv6Values is the values file of an IPv6 install: the reference's IPv6
// mode (one /80 on each node's primary ENI, pods addressed from it) with
// IPv4 egress (ENABLE_V4_EGRESS, on by default).
const IPv6Values = `env:
  ENABLE_IPv6: "true"
  ENABLE_IPv4: "false"
  ENABLE_PREFIX_DELEGATION: "true"
`

// WriteIPv6Values writes IPv6Values into the cluster's directory and returns
// the file's path, for Scenario.Values.
func (c *Cluster) WriteIPv6Values() (string, error) {
	p := filepath.Join(c.Dir, "ipv6-values.yaml")
	return p, os.WriteFile(p, []byte(IPv6Values), 0o644)
}

// RunIPv6 is the walk-through of an IPv6 cluster (Options.IPv6, Values
// IPv6Values): install, the workload, EC2's view of the pod addresses,
// IPv6 pings across nodes, IPv4 egress to the outside host, and pods kept
// from IMDS over both families. Pods
// defaults to 6.
func (s *Scenario) RunIPv6(ctx context.Context) error {
	if s.Pods == 0 {
		s.Pods = 6
	}
	return s.runSteps(ctx, []step{
		{"helm install (IPv6 mode)", s.install},
		{"deploy the workload", s.deploy},
		{"EC2 agrees (IPv6)", s.ec2AgreesIPv6},
		{"IPv6 traffic across nodes", s.crossNode},
		{"IPv4 egress to the outside host", s.egress4},
		{"pods kept from IMDS", s.imdsBlocked},
	})
}

// imdsBlocked checks a pod is refused at IMDS over IPv6 (fd00:ec2::254)
// and over IPv4 (169.254.169.254, through its IPv4 egress), as the chart's
// default VPCIP_IMDS_POD_ACCESS=blocked asks, while its node reaches both.
func (s *Scenario) imdsBlocked(ctx context.Context) error {
	pods, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil || len(pods) == 0 {
		return fmt.Errorf("pods: %v (%d)", err, len(pods))
	}
	p := pods[0]
	pid, err := s.podPID(ctx, p)
	if err != nil {
		return err
	}
	n := s.C.Node(p.Node)
	for _, imds := range []string{"[fd00:ec2::254]:80", "169.254.169.254:80"} {
		if err := dialIn(filepath.Join("/var/run/netns", n.Netns), imds); err != nil {
			return fmt.Errorf("node %s -> IMDS %s: %w", n.Name, imds, err)
		}
		err := dialIn(fmt.Sprintf("/proc/%d/ns/net", pid), imds)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("pod %s -> IMDS %s: %v, want connection refused (VPCIP_IMDS_POD_ACCESS=blocked)", p.Name, imds, err)
		}
	}
	s.Logf("   pod %s is refused at IMDS on fd00:ec2::254 and 169.254.169.254; its node %s reaches both", p.Name, n.Name)
	return nil
}

// dialIn opens a TCP connection to hostport from the netns at path (3 s
// bound) and closes it.
func dialIn(path, hostport string) error {
	h, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	defer h.Close()
	var derr error
	err = h.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", hostport, 3*time.Second)
		if err == nil {
			c.Close()
		}
		derr = err
		return nil
	})
	return errors.Join(err, derr)
}

// ec2AgreesIPv6 checks each pod has exactly one address, IPv6, inside the
// /80 EC2 assigned to its node's primary ENI (vpcsim's model), no address
// twice, each node's primary ENI holding exactly one /80 and no IPv4
// prefix or secondary address, and the API server's Services IPv6.
func (s *Scenario) ec2AgreesIPv6(ctx context.Context) error {
	pods, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil {
		return err
	}
	primary := map[string]netip.Prefix{} // instance -> its primary ENI's /80
	var errs []error
	for _, e := range s.C.Cloud.NetworkInterfaces() {
		if e.DeviceIndex != 0 || e.InstanceID == "" {
			continue
		}
		if len(e.IPv6Prefixes) != 1 || len(e.SecondaryIPs) != 0 || len(e.Prefixes) != 0 {
			errs = append(errs, fmt.Errorf("primary ENI %s of %s: IPv6 prefixes %v, IPv4 secondaries %v, IPv4 prefixes %v; want one /80 and nothing of IPv4",
				e.ID, e.InstanceID, e.IPv6Prefixes, e.SecondaryIPs, e.Prefixes))
			continue
		}
		primary[e.InstanceID] = e.IPv6Prefixes[0]
	}
	seen := map[netip.Addr]string{}
	for _, p := range pods {
		a, err := netip.ParseAddr(p.IP)
		// One pod IP: the pod's node-local IPv4 egress address is wired in
		// the pod but left out of the plugin's result, so kubelet does not
		// list it.
		if err != nil || !a.Is6() || len(p.IPs) != 1 || p.IPs[0] != p.IP {
			errs = append(errs, fmt.Errorf("pod %s: podIP %q, podIPs %v; want its IPv6 address alone", p.Name, p.IP, p.IPs))
			continue
		}
		if other, dup := seen[a]; dup {
			errs = append(errs, fmt.Errorf("pods %s and %s share %s", p.Name, other, a))
		}
		seen[a] = p.Name
		var want netip.Prefix
		if n := s.C.Node(p.Node); n != nil {
			want = primary[n.InstanceID]
		}
		if !want.Contains(a) {
			errs = append(errs, fmt.Errorf("pod %s on %s has %s, outside the /80 %v EC2 assigned to its node's primary ENI", p.Name, p.Node, a, want))
		}
	}
	svc, err := s.C.Kubectl(ctx, "get", "service", "kubernetes", "-o", "jsonpath={.spec.ipFamilies} {.spec.clusterIP}")
	if err != nil || !strings.Contains(svc, `["IPv6"]`) {
		errs = append(errs, fmt.Errorf("service kubernetes: %s %v; want IPv6 single-stack", svc, err))
	}
	if len(errs) == 0 {
		for _, n := range s.C.Nodes {
			s.Logf("   %s (node IP %s): /80 %s", n.Name, n.PrimaryIP, primary[n.InstanceID])
		}
		s.Logf("   each of the %d pods has one pod IP, IPv6, in its node's /80; Service kubernetes %s; AssignIpv6Addresses calls: %d",
			len(pods), svc, s.C.Cloud.Faults().Calls("AssignIpv6Addresses"))
	}
	return errors.Join(errs...)
}

// egress4 has a pod on each node send UDP to the outside host's IPv4
// address (fabric.OutsideAddr, which only an instance's primary IPv4
// address reaches: fabric.EnableOutsideHost) and checks the outside host
// saw the pod's node's primary IPv4 address as the source and answered.
func (s *Scenario) egress4(ctx context.Context) error {
	to, err := s.C.Fabric.EnableOutsideHost()
	if err != nil {
		return err
	}
	pods, err := s.C.Pods(ctx, "default", "app="+workload)
	if err != nil {
		return err
	}
	done := map[string]bool{}
	for _, p := range pods {
		if done[p.Node] {
			continue
		}
		pid, err := s.podPID(ctx, p)
		if err != nil {
			return err
		}
		src, err := udpEcho(fmt.Sprintf("/proc/%d/ns/net", pid), filepath.Join("/var/run/netns", s.C.Fabric.OutsideNetns()), to)
		if err != nil {
			return fmt.Errorf("pod %s (%s) on %s to %s: %w", p.Name, p.IP, p.Node, to, err)
		}
		if want := s.C.Node(p.Node).PrimaryIPv4; src.String() != want {
			return fmt.Errorf("pod %s on %s: the outside host saw source %s, want the node's primary IPv4 address %s", p.Name, p.Node, src, want)
		}
		s.Logf("   pod %s (%s) on %s reached %s over IPv4; the outside host saw %s", p.Name, p.IP, p.Node, to, src)
		done[p.Node] = true
	}
	if len(done) != len(s.C.Nodes) {
		return fmt.Errorf("pods on %d of %d nodes", len(done), len(s.C.Nodes))
	}
	return nil
}

// udpEcho listens for UDP on to:7777 in the netns at path at, sends a
// datagram from the netns at path from and returns the source address the
// listener saw, once the reply came back.
func udpEcho(from, at string, to netip.Addr) (netip.Addr, error) {
	inNS := func(path string, fn func() error) error {
		h, err := ns.GetNS(path)
		if err != nil {
			return err
		}
		defer h.Close()
		return h.Do(func(ns.NetNS) error { return fn() })
	}
	dst := &net.UDPAddr{IP: net.IP(to.AsSlice()), Port: 7777}
	var srv *net.UDPConn
	if err := inNS(at, func() (err error) { srv, err = net.ListenUDP("udp4", dst); return err }); err != nil {
		return netip.Addr{}, fmt.Errorf("listen on the outside host: %w", err)
	}
	defer srv.Close()
	seen := make(chan netip.Addr, 16)
	go func() {
		buf := make([]byte, 64)
		for {
			n, src, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			select {
			case seen <- src.Addr().Unmap():
			default:
			}
			srv.WriteToUDPAddrPort(buf[:n], src)
		}
	}()
	var cl *net.UDPConn
	if err := inNS(from, func() (err error) { cl, err = net.DialUDP("udp4", nil, dst); return err }); err != nil {
		return netip.Addr{}, fmt.Errorf("dial from the pod: %w", err)
	}
	defer cl.Close()
	var last error
	for range 10 {
		if _, err := cl.Write([]byte("egress")); err != nil {
			last = err
			time.Sleep(500 * time.Millisecond)
			continue
		}
		cl.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 64)
		if _, err := cl.Read(buf); err != nil {
			last = err
			continue
		}
		return <-seen, nil
	}
	return netip.Addr{}, fmt.Errorf("no answer: %v", last)
}
