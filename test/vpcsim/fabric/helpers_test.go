package fabric

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/test/vpcsim"
)

var (
	subnet  = netip.MustParsePrefix("100.64.0.0/20")
	gateway = netip.MustParseAddr("100.64.0.1")
)

// newTestFabric makes a fabric with a unique prefix ("vf" and 4 hex digits),
// removed when the test ends, and checks nothing of it is left.
func newTestFabric(t testing.TB) *Fabric {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	b := make([]byte, 3)
	rand.Read(b)
	prefix := "vf" + hex.EncodeToString(b)[:4]
	f, err := New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if left := netnsWithPrefix(t, prefix); len(left) > 0 {
			t.Errorf("netns left after Close: %v", left)
		}
		Cleanup(prefix)
	})
	return f
}

// netnsWithPrefix lists the named netns "<prefix>-*".
func netnsWithPrefix(t testing.TB, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// testENI is an ENI of subnet 100.64.0.0/20 as the model reports it.
func testENI(id string, device int, primary string, mac string) vpcsim.ENIInfo {
	return vpcsim.ENIInfo{
		ID: id, MAC: mac, DeviceIndex: device, Status: "in-use", AttachmentStatus: "attached",
		PrimaryIP: netip.MustParseAddr(primary), SubnetCIDR: subnet, Gateway: gateway,
	}
}

// handleIn opens a netlink socket inside a named netns.
func handleIn(t *testing.T, name string) netlinksafe.Handle {
	t.Helper()
	nsh, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlinksafe.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// doIn runs fn with the calling goroutine's thread in the named netns.
func doIn(t *testing.T, name string, fn func() error) {
	t.Helper()
	if err := ns.WithNetNSPath(netnsPath(name), func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatalf("in %s: %v", name, err)
	}
}

// configureSecondary sets up eth1 of instance A as the daemon does for a
// secondary ENI of subnet 100.64.0.0/20 whose primary is primaryA1: up, with
// its primary address and table 2 routing via the subnet gateway, and, for
// the test, addrs as local addresses sent from by eth1 ("from <addr> lookup
// 2").
func configureSecondary(t *testing.T, h netlinksafe.Handle, addrs ...netip.Addr) {
	t.Helper()
	configureENI(t, h, eniLink{primary: primaryA1, subnet: subnet, gateway: gateway}, addrs...)
}

// eniLink is what the daemon knows of a secondary ENI on eth1.
type eniLink struct {
	primary netip.Addr
	subnet  netip.Prefix
	gateway netip.Addr
}

// configureENI is configureSecondary for an ENI of any subnet.
func configureENI(t *testing.T, h netlinksafe.Handle, e eniLink, addrs ...netip.Addr) {
	t.Helper()
	eth1, err := h.LinkByName("eth1")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(eth1); err != nil {
		t.Fatal(err)
	}
	idx := eth1.Attrs().Index
	// The ENI's primary address, as the daemon puts it on the link: the
	// source of the instance's ARP requests on eth1.
	enip := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(e.primary, e.subnet.Bits())), Flags: unix.IFA_F_NOPREFIXROUTE}
	if err := h.AddrAdd(eth1, enip); err != nil {
		t.Fatal(err)
	}
	routes := []*netlink.Route{
		{LinkIndex: idx, Dst: ipNet(e.subnet), Scope: netlink.SCOPE_LINK, Table: 2},
		{LinkIndex: idx, Gw: e.gateway.AsSlice(), Table: 2},
	}
	for _, a := range addrs {
		if err := h.AddrAdd(eth1, hostAddr(a)); err != nil {
			t.Fatal(err)
		}
		r := netlink.NewRule()
		r.Src, r.Table, r.Priority = ipNet(netip.PrefixFrom(a, 32)), 2, 1536
		if err := h.RuleAdd(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range routes {
		if err := h.RouteReplace(r); err != nil {
			t.Fatal(err)
		}
	}
	// The router delivers without ARP, so nothing retries a first packet that
	// its end of the veth drops before the kernel's link watcher activated it
	// after this carrier change: wait for eth1 to be up, then for that
	// (asynchronous, normally immediate) activation.
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := h.LinkByIndex(idx)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			time.Sleep(300 * time.Millisecond)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("eth1 not operationally up: %s", l.Attrs().OperState)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listenUDP opens a UDP socket on addr inside the named netns.
func listenUDP(t *testing.T, netnsName string, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	doIn(t, netnsName, func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// sendUDP sends payload to dst from a socket made inside the named netns,
// bound to src and, if dev is not empty, to that device (SO_BINDTODEVICE), so
// the packet leaves by dev whatever the rules say.
func sendUDP(t *testing.T, netnsName string, src netip.Addr, dev string, dst netip.AddrPort, payload string) {
	t.Helper()
	d := net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	if dev != "" {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, dev)
			})
			return errors.Join(err, serr)
		}
	}
	var c net.Conn
	doIn(t, netnsName, func() error {
		var err error
		c, err = d.DialContext(context.Background(), "udp4", dst.String())
		return err
	})
	defer c.Close()
	if _, err := c.Write([]byte(payload)); err != nil {
		t.Fatalf("send %q from %s: %v", payload, src, err)
	}
}

// receive reports whether c gets payload within wait; other datagrams are
// skipped. wait bounds how long an absent packet is waited for; it is not a
// speed assertion.
func receive(t *testing.T, c *net.UDPConn, payload string, wait time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return false
			}
			t.Fatal(err)
		}
		if string(buf[:n]) == payload {
			return true
		}
	}
}

// rpFilterDrops reads the router's count of packets dropped by reverse-path
// filtering (TcpExt IPReversePathFilter in /proc/net/netstat).
func rpFilterDrops(t *testing.T, f *Fabric) uint64 {
	t.Helper()
	var n uint64
	doIn(t, f.RouterNetns(), func() error {
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		n, err = netstatField(string(b), "TcpExt", "IPReversePathFilter")
		return err
	})
	return n
}

// netstatField finds one counter in /proc/net/netstat's pairs of header and
// value lines.
func netstatField(text, group, field string) (uint64, error) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != group+":" || len(values) != len(names) {
			continue
		}
		for j, name := range names {
			if name == field {
				return strconv.ParseUint(values[j], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("%s %s not in netstat", group, field)
}

// sysctlIn reads /proc/sys/<key> inside the named netns.
func sysctlIn(t *testing.T, netnsName, key string) string {
	t.Helper()
	var v string
	doIn(t, netnsName, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v
}

// routesTo lists the router's main-table routes whose destination is p.
func routesTo(t *testing.T, f *Fabric, p netip.Prefix) []netlink.Route {
	t.Helper()
	h := handleIn(t, f.RouterNetns())
	filter := &netlink.Route{Dst: ipNet(p), Table: syscall.RT_TABLE_MAIN}
	rs, err := h.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
