package vpcsimtest_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// ipv6Config is one subnet whose new ENIs get an IPv6 address (EC2's
// AssignIpv6AddressOnCreation, as EKS IPv6 clusters require), so that each
// instance's eth0 has its primary IPv6 address.
func ipv6Config() vpcsim.Config {
	return vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{
		CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a", AssignIPv6OnCreation: true,
	}}}
}

// operatorEC2 is an EC2 client for the test itself, on loopback.
func operatorEC2(f *vpcsimtest.Fabricated) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:           f.Cloud.Region(),
		BaseEndpoint:     aws.String(f.LocalEC2URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		RetryMaxAttempts: 1,
	})
}

// primaryIPv6 returns the instance's primary IPv6 address, failing the
// test when it has none.
func primaryIPv6(t *testing.T, inst vpcsim.InstanceInfo) netip.Addr {
	t.Helper()
	if len(inst.PrimaryENI.IPv6Addresses) == 0 {
		t.Fatalf("%s has no IPv6 address", inst.ID)
	}
	return inst.PrimaryENI.IPv6Addresses[0]
}

// addLocal puts addrs on the instance's lo as /128s, as a daemon or a pod
// behind the instance would hold them: the router decides whether packets
// reach them.
func addLocal(t *testing.T, f *vpcsimtest.Fabricated, instanceID string, addrs ...netip.Addr) {
	t.Helper()
	h := nodeHandle(t, f, instanceID)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: netlink.NewIPNet(a.AsSlice()), Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(lo, addr); err != nil {
			t.Fatalf("add %s to lo: %v", a, err)
		}
	}
}

// serveTCP accepts TCP connections on addr inside the netns at nsPath and
// writes "hello from <addr>" to each, telling the peer's address on
// peers.
func serveTCP(t *testing.T, nsPath string, addr netip.AddrPort) <-chan netip.Addr {
	t.Helper()
	var l net.Listener
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp6", addr.String())
		return err
	})
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	peers := make(chan netip.Addr, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case peers <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr():
			default:
			}
			io.WriteString(c, "hello from "+addr.Addr().String())
			c.Close()
		}
	}()
	return peers
}

// dialTCP connects from inside the netns at nsPath to addr and reads the
// greeting; it returns the error of the dial or read.
func dialTCP(nsPath string, addr netip.AddrPort) error {
	c, err := fabric.DialContextPath(nsPath)(context.Background(), "tcp6", addr.String())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if want := "hello from " + addr.Addr().String(); string(b) != want {
		return &net.AddrError{Err: "greeting " + string(b), Addr: addr.String()}
	}
	return nil
}

// routerRoute returns the device of the router's main-table route to
// exactly p (IPv4 or IPv6), or "".
func routerRoute(t *testing.T, f *vpcsimtest.Fabricated, p netip.Prefix) string {
	t.Helper()
	nsh, err := netns.GetFromName(f.Fabric.RouterNetns())
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlinksafe.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	family := netlink.FAMILY_V6
	if p.Addr().Is4() {
		family = netlink.FAMILY_V4
	}
	filter := &netlink.Route{Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Table: unix.RT_TABLE_MAIN}
	rs, err := h.RouteListFiltered(family, filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) == 0 {
		return ""
	}
	link, err := h.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		t.Fatal(err)
	}
	return link.Attrs().Name
}

// TestIPv6AddressReachableOnlyWhileAssigned: an IPv6 address held by
// instance A is reachable over TCP from instance B's netns only while EC2
// has it assigned to A's ENI (AssignIpv6Addresses, then
// UnassignIpv6Addresses); the router's route to it comes and goes with it,
// and goes with A's termination.
func TestIPv6AddressReachableOnlyWhileAssigned(t *testing.T) {
	f := vpcsimtest.StartFabric(t, ipv6Config(), uniquePrefix())
	a := f.Launch(t, "m5.large")
	b := f.Launch(t, "m5.large")
	client := operatorEC2(f)
	ctx := context.Background()

	subnet := a.PrimaryENI.SubnetIPv6CIDR
	x := subnet.Addr().As16()
	x[15], x[14], x[10] = 0x99, 0x01, 0x7a // somewhere in the /64, not reserved
	addr := netip.AddrFrom16(x)
	addLocal(t, f, a.ID, addr)
	serveTCP(t, f.NetnsPath(a.ID), netip.AddrPortFrom(addr, 9000))
	to := netip.AddrPortFrom(addr, 9000)

	if err := dialTCP(f.NetnsPath(b.ID), to); err == nil {
		t.Fatalf("%s reached from B before it was assigned", addr)
	} else {
		t.Logf("before assign: %v", err)
	}
	_, err := client.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{
		NetworkInterfaceId: aws.String(a.PrimaryENI.ID), Ipv6Addresses: []string{addr.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := dialTCP(f.NetnsPath(b.ID), to); err != nil {
		t.Fatalf("%s not reached from B while assigned to A: %v", addr, err)
	}
	if dev := routerRoute(t, f, netip.PrefixFrom(addr, 128)); !strings.HasPrefix(dev, f.Fabric.Prefix()+"e") {
		t.Errorf("router route to %s via %q, want A's ENI's router end", addr, dev)
	}
	_, err = client.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{
		NetworkInterfaceId: aws.String(a.PrimaryENI.ID), Ipv6Addresses: []string{addr.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := dialTCP(f.NetnsPath(b.ID), to); err == nil {
		t.Fatalf("%s reached from B after it was unassigned", addr)
	} else {
		t.Logf("after unassign: %v", err)
	}
	if dev := routerRoute(t, f, netip.PrefixFrom(addr, 128)); dev != "" {
		t.Errorf("router still routes %s via %s after unassign", addr, dev)
	}

	primaryA := primaryIPv6(t, a)
	if dev := routerRoute(t, f, netip.PrefixFrom(primaryA, 128)); dev == "" {
		t.Fatalf("router does not route A's primary IPv6 %s", primaryA)
	}
	if err := f.Cloud.TerminateInstance(a.ID); err != nil {
		t.Fatal(err)
	}
	if dev := routerRoute(t, f, netip.PrefixFrom(primaryA, 128)); dev != "" {
		t.Errorf("router still routes %s via %s after A was terminated", primaryA, dev)
	}
}

// TestIPv6PrefixRouted: with a /80 assigned to A's ENI, an address inside
// it is reachable from B and one just outside it (also held by A) is not;
// unassigning the /80 removes its route and the address inside is cut off.
// Replies show B's primary IPv6 address as the source (no NAT in the VPC).
func TestIPv6PrefixRouted(t *testing.T) {
	f := vpcsimtest.StartFabric(t, ipv6Config(), uniquePrefix())
	a := f.Launch(t, "m5.large")
	b := f.Launch(t, "m5.large")
	client := operatorEC2(f)
	ctx := context.Background()

	out, err := client.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{
		NetworkInterfaceId: aws.String(a.PrimaryENI.ID), Ipv6PrefixCount: aws.Int32(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.AssignedIpv6Prefixes) != 1 {
		t.Fatalf("assigned prefixes %v, want one /80", out.AssignedIpv6Prefixes)
	}
	p := netip.MustParsePrefix(out.AssignedIpv6Prefixes[0])
	in := p.Addr().As16()
	in[15] = 0x42
	inside := netip.AddrFrom16(in)
	nb := p.Addr().As16()
	nb[9] ^= 0x01 // the neighbouring /80
	nb[15] = 0x42
	outside := netip.AddrFrom16(nb)
	addLocal(t, f, a.ID, inside, outside)
	peersIn := serveTCP(t, f.NetnsPath(a.ID), netip.AddrPortFrom(inside, 9000))
	serveTCP(t, f.NetnsPath(a.ID), netip.AddrPortFrom(outside, 9000))

	if err := dialTCP(f.NetnsPath(b.ID), netip.AddrPortFrom(inside, 9000)); err != nil {
		for _, n := range []string{f.Fabric.RouterNetns(), f.Fabric.NodeNetns(a.ID), f.Fabric.NodeNetns(b.ID)} {
			o, _ := exec.Command("sh", "-c", "ip netns exec "+n+" sh -c 'ip -6 route; ip -6 addr; ip -6 neigh; nstat -az | grep -i -E \"Ip6(In|Out)No|Ip6InAddrErr|Icmp6OutDestUnreachs|Icmp6InDestUnr|Ip6OutForw|Ip6InDiscards|Ip6InHdrErrors\"'").CombinedOutput()
			t.Logf("%s:\n%s", n, o)
		}
		t.Fatalf("%s inside the assigned %s not reached from B: %v", inside, p, err)
	}
	if src := <-peersIn; src != primaryIPv6(t, b) {
		t.Errorf("A saw the connection from %s, want B's primary IPv6 %s", src, primaryIPv6(t, b))
	}
	if err := dialTCP(f.NetnsPath(b.ID), netip.AddrPortFrom(outside, 9000)); err == nil {
		t.Errorf("%s outside the assigned %s reached from B", outside, p)
	} else {
		t.Logf("outside the /80: %v", err)
	}
	if dev := routerRoute(t, f, p); !strings.HasPrefix(dev, f.Fabric.Prefix()+"e") {
		t.Errorf("router route to %s via %q, want A's ENI's router end", p, dev)
	}
	_, err = client.UnassignIpv6Addresses(ctx, &ec2.UnassignIpv6AddressesInput{
		NetworkInterfaceId: aws.String(a.PrimaryENI.ID), Ipv6Prefixes: []string{p.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if dev := routerRoute(t, f, p); dev != "" {
		t.Errorf("router still routes %s via %s after unassign", p, dev)
	}
	if err := dialTCP(f.NetnsPath(b.ID), netip.AddrPortFrom(inside, 9000)); err == nil {
		t.Errorf("%s reached from B after %s was unassigned", inside, p)
	} else {
		t.Logf("after unassign: %v", err)
	}
}

// TestIMDSOverIPv6: IMDSv2 at [fd00:ec2::254] answers each instance for
// itself (token, then instance-id and its primary IPv6 address), through
// the SDK's IMDS client from inside the instance's netns.
func TestIMDSOverIPv6(t *testing.T) {
	f := vpcsimtest.StartFabric(t, ipv6Config(), uniquePrefix())
	a := f.Launch(t, "m5.large")
	b := f.Launch(t, "m5.large")
	for _, inst := range []vpcsim.InstanceInfo{a, b} {
		c := imds.New(imds.Options{Endpoint: fabric.IMDSURL6, HTTPClient: f.HTTPClient(inst.ID)})
		for path, want := range map[string]string{"instance-id": inst.ID, "ipv6": primaryIPv6(t, inst).String()} {
			out, err := c.GetMetadata(context.Background(), &imds.GetMetadataInput{Path: path})
			if err != nil {
				t.Fatalf("IMDS %s over IPv6 from %s: %v", path, inst.ID, err)
			}
			got, err := io.ReadAll(out.Content)
			out.Content.Close()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Errorf("%s from %s over IPv6 = %q, want %q", path, inst.ID, got, want)
			}
		}
	}
	// The raw IMDSv2 exchange: a PUT for the token, then a GET with it.
	client := f.HTTPClient(a.ID)
	req, _ := http.NewRequest(http.MethodPut, fabric.IMDSURL6+"/latest/api/token", nil)
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	token, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(token) == 0 {
		t.Fatalf("token over IPv6: HTTP %d %q", resp.StatusCode, token)
	}
	req, _ = http.NewRequest(http.MethodGet, fabric.IMDSURL6+"/latest/meta-data/local-ipv4", nil)
	req.Header.Set("X-aws-ec2-metadata-token", string(token))
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != a.PrimaryENI.PrimaryIP.String() {
		t.Errorf("local-ipv4 over IPv6 with the token: HTTP %d %q, want %s", resp.StatusCode, body, a.PrimaryENI.PrimaryIP)
	}
}

// TestOutsideHostOverIPv6: the outside host has 2001:db8::10 and an
// instance reaches it from its primary IPv6 address, which it sees as the
// source (IPv6 leaves a VPC without NAT).
func TestOutsideHostOverIPv6(t *testing.T) {
	f := vpcsimtest.StartFabric(t, ipv6Config(), uniquePrefix())
	a := f.Launch(t, "m5.large")
	if _, err := f.Fabric.EnableOutsideHost(); err != nil {
		t.Fatal(err)
	}
	to := netip.AddrPortFrom(fabric.OutsideAddr6, 9000)
	peers := serveTCP(t, fabric.NetnsPath(f.Fabric.OutsideNetns()), to)
	if err := dialTCP(f.NetnsPath(a.ID), to); err != nil {
		t.Fatalf("outside host %s not reached from A: %v", to, err)
	}
	if src := <-peers; src != primaryIPv6(t, a) {
		t.Errorf("outside host saw %s, want A's primary IPv6 %s", src, primaryIPv6(t, a))
	}
}
