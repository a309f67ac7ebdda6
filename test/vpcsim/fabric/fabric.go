// Package fabric mirrors vpcsim's EC2 model in Linux network namespaces, so
// that packets between simulated instances follow a VPC's rules.
//
// Layout, for a fabric made with prefix p:
//
//   - netns "p-rtr" is the VPC router. It owns one veth end per attached ENI
//     (named p + "e" + 8 hex digits of the ENI ID's SHA-1), a /32 or /28
//     route to that end for every private address or prefix assigned to the
//     ENI, the subnet gateway (.1) of the ENI's subnet, and 169.254.169.254,
//     where the EC2 API (port 8080) and IMDS (port 80) listen (for IPv6
//     see below).
//   - each instance is a netns "p-<last 8 hex digits of its ID>" whose eth0 is
//     its primary ENI (MAC, primary address, subnet route, default route via
//     the gateway, route to 169.254.169.254) and whose ethN (N = device index)
//     are its secondary ENIs: MAC set, left down and unaddressed, as EC2
//     leaves them for the operating system to configure.
//   - optionally netns "p-out" at 203.0.113.10, an outside host that only the
//     instances' primary addresses can reach (as only they would be NATed to a
//     public address by EC2).
//
// The router answers ARP for the subnet gateway, a /32 on every router end,
// and by proxy ARP for every other address it routes, as EC2's VPC router
// answers for the whole subnet: instances on one subnet talk through the
// router too.
//
// Like EC2, the router delivers to an ENI by its MAC, not by ARP: the ENI's
// primary address has a permanent neighbour entry on the router end and every
// other address or prefix of the ENI is routed via it, so addresses that live
// behind the instance (pods) need no ARP answer from it.
//
// Strict reverse-path filtering (rp_filter=1) on every router end plays EC2's
// source/destination check: the router only has a route back to an address
// through the ENI it is assigned to, so a packet whose source is unassigned,
// or assigned to another ENI, is dropped where it enters the router. The
// kernel applies the same check to ARP requests, so the router answers an
// instance's ARP only when the sender address belongs to that ENI: the
// daemon puts each ENI's primary address on its link, as EC2's own agents do.
//
// IPv6 is routed the same way, with a fixed, documented scheme where EC2
// uses router advertisements and DHCPv6:
//
//   - the router forwards IPv6 (net.ipv6.conf.all.forwarding=1) and holds
//     fd00:ec2::254/128 on its loopback: IMDS (port 80) and the EC2 API
//     (port 8080) listen there too, as on Nitro instances (IMDSURL6).
//   - every router end holds fe80::1/64, the VPC router's address on every
//     ENI link (GatewayIPv6), and a permanent neighbour entry for the ENI's
//     EUI-64 link-local address (fe80:: + the MAC with the universal/local bit
//     (0x02) of its first byte flipped and ff:fe in the middle, as the
//     kernel derives it) with the ENI's MAC. Each IPv6 address (/128) and
//     /80 prefix EC2 assigns to the ENI is routed via that link-local
//     address on that end, so the router delivers by MAC without neighbour
//     discovery; the route goes on
//     unassign, and with the veth on detach and terminate.
//   - when the primary ENI's subnet has an IPv6 /64, eth0 gets
//     "default via fe80::1 dev eth0", "fd00:ec2::254 via fe80::1 dev eth0"
//     and, if the ENI has IPv6 addresses when it is attached (a subnet with
//     AssignIPv6OnCreation), its first one as a /128: the ENI's primary IPv6
//     address, also IMDS's ipv6 and the address IMDS knows the instance by
//     over IPv6. There is no on-link /64: every IPv6 packet, also to the
//     same subnet, goes through the router. Addresses assigned later, and
//     secondary ENIs (route via fe80::1 dev ethN), are the daemon's to
//     configure, as for IPv4.
//   - duplicate address detection is off in every fabric netns
//     (net.ipv6.conf.{all,default}.accept_dad=0), so addresses are usable
//     at once, also those a daemon adds later.
//   - the outside host also has 2001:db8::10/64, the router's end
//     2001:db8::1/64; every routed IPv6 address reaches it (EC2 routes
//     IPv6 to an internet gateway without NAT).
//   - unlike IPv4, the router does not check IPv6 source addresses: a
//     packet from an unassigned IPv6 source is forwarded.
//
// Nothing is linked to the host's interfaces and the router has no default
// route: no packet can leave the fabric. Every netns and link name starts
// with the prefix so that several fabrics run side by side; Cleanup removes
// what a crashed process left behind.
package fabric

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// Addresses served inside the fabric, as seen from every instance netns.
const (
	// MetadataAddr is the link-local address of IMDS and of the EC2 API,
	// routed from every instance's eth0 to the router.
	MetadataAddr = "169.254.169.254"
	// IMDSAddr is where IMDS listens inside the router netns.
	IMDSAddr = MetadataAddr + ":80"
	// EC2Addr is where the EC2 Query API listens inside the router
	// netns. EC2's real endpoint is outside the VPC; the fabric has no
	// outside, so the API shares IMDS's address on another port.
	EC2Addr = MetadataAddr + ":8080"
	// IMDSURL and EC2URL are the endpoints for AWS_EC2_METADATA_SERVICE_ENDPOINT
	// and AWS_ENDPOINT_URL_EC2 inside an instance netns.
	IMDSURL = "http://" + MetadataAddr
	EC2URL  = "http://" + EC2Addr
)

// ENIMTU is the MTU of every ENI veth, EC2's jumbo-frame MTU inside a VPC.
const ENIMTU = 9001

// netnsDir is where named network namespaces are bind-mounted, as by
// `ip netns add`.
const netnsDir = "/var/run/netns"

var (
	metadataIP = netip.MustParseAddr(MetadataAddr)
	prefixRE   = regexp.MustCompile(`^[a-z][a-z0-9]{0,5}$`)
)

// Fabric is a running netns fabric. It implements vpcsim.Observer: set it on
// a Cloud with SetObserver and every attach, detach, assign, unassign and
// termination in the model is mirrored here. Its methods are safe for
// concurrent use.
type Fabric struct {
	prefix string
	rtrNS  ns.NetNS           // the router netns, open for the fabric's life
	rtr    netlinksafe.Handle // netlink socket inside the router netns

	mu        sync.Mutex // guards the fields below
	log       *slog.Logger
	instances map[string]*instance // by instance ID
	enis      map[string]*attached // by ENI ID
	listeners []net.Listener
	lastIndex int // interface index of the last router end made
	outside   bool
	errs      []error
	closed    bool
}

var _ vpcsim.Observer = (*Fabric)(nil)

// instance is one instance netns.
type instance struct {
	netns   string // netns name
	nsh     netns.NsHandle
	h       netlinksafe.Handle // netlink socket inside the instance netns
	primary netip.Addr         // primary address of the primary ENI, once attached
}

// attached is one attached ENI: a veth from the instance to the router.
type attached struct {
	instanceID string
	routerLink string     // name of the router end, in the router netns
	primary    netip.Addr // the ENI's primary address: next hop of its other routes
	// ll is the ENI's EUI-64 link-local address: next hop of its IPv6
	// routes.
	ll netip.Addr
	// addr6 is the primary IPv6 address the fabric put on eth0 (device 0
	// only), or not valid.
	addr6 netip.Addr
}

// New creates the router netns "<prefix>-rtr" with IP forwarding on and the
// metadata address on its loopback. prefix is 1 to 6 characters [a-z0-9]
// starting with a letter (so that link names fit the kernel's 15). New fails
// if a netns of that name exists already: remove leftovers with Cleanup.
func New(prefix string) (*Fabric, error) {
	if !prefixRE.MatchString(prefix) {
		return nil, fmt.Errorf("fabric: prefix %q: want 1 to 6 characters [a-z0-9] starting with a letter", prefix)
	}
	f := &Fabric{
		prefix:    prefix,
		instances: map[string]*instance{},
		enis:      map[string]*attached{},
	}
	name := f.routerNetns()
	if err := createNetns(name); err != nil {
		return nil, fmt.Errorf("fabric: router: %w", err)
	}
	if err := f.setupRouter(name); err != nil {
		f.closeRouter()
		return nil, fmt.Errorf("fabric: router: %w", err)
	}
	return f, nil
}

// setupRouter opens the router netns and sets it up as a VPC router.
func (f *Fabric) setupRouter(name string) error {
	var err error
	if f.rtrNS, err = ns.GetNS(netnsPath(name)); err != nil {
		return err
	}
	if f.rtr, err = netlinksafe.NewHandleAt(netns.NsHandle(f.rtrNS.Fd())); err != nil {
		return err
	}
	lo, err := f.rtr.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := f.rtr.LinkSetUp(lo); err != nil {
		return err
	}
	if err := f.rtr.AddrReplace(lo, hostAddr(metadataIP)); err != nil {
		return fmt.Errorf("add %s to lo: %w", MetadataAddr, err)
	}
	if err := f.rtr.AddrReplace(lo, addrNoDAD(netip.PrefixFrom(metadataIP6, 128))); err != nil {
		return fmt.Errorf("add %s to lo: %w", MetadataAddr6, err)
	}
	// Links made later inherit the "default" values; routerEndSysctls sets
	// them on each ENI's router end again, with the neighbour settings that
	// have no per-netns default.
	return f.rtrNS.Do(func(ns.NetNS) error {
		return errors.Join(writeSysctls(map[string]string{
			"net/ipv4/ip_forward":                  "1",
			"net/ipv4/conf/all/rp_filter":          "0",
			"net/ipv4/conf/default/rp_filter":      "1",
			"net/ipv4/conf/default/proxy_arp":      "1",
			"net/ipv4/conf/all/send_redirects":     "0",
			"net/ipv4/conf/default/send_redirects": "0",
		}), writeSysctls(routerSysctls6), writeSysctls(noDADSysctls))
	})
}

// routerEndSysctls makes a router end act as the VPC router on an ENI:
// strict reverse-path filtering (EC2's source/destination check) and proxy
// ARP (the VPC router answers ARP for every address of the subnet, so
// instances on the same subnet talk through the router and the check applies
// to them too), without the kernel's random delay of up to 0.8 s before a
// proxy ARP reply. No redirects: the router is the only path, as in a VPC.
func routerEndSysctls(name string) map[string]string {
	return map[string]string{
		"net/ipv4/conf/" + name + "/rp_filter":      "1",
		"net/ipv4/conf/" + name + "/proxy_arp":      "1",
		"net/ipv4/conf/" + name + "/send_redirects": "0",
		"net/ipv4/neigh/" + name + "/proxy_delay":   "0",
	}
}

// SetLogger makes the fabric log each failed operation to l (nil: none).
func (f *Fabric) SetLogger(l *slog.Logger) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = l
}

// Err returns every error met while mirroring the model (Observer methods
// cannot return one), joined, or nil.
func (f *Fabric) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

// failLocked records err for Err and logs it.
func (f *Fabric) failLocked(err error) {
	f.errs = append(f.errs, err)
	if f.log != nil {
		f.log.Error("fabric operation failed", "err", err)
	}
}

// Prefix returns the name prefix of every netns and link of the fabric.
func (f *Fabric) Prefix() string { return f.prefix }

// RouterNetns returns the name of the router netns ("<prefix>-rtr").
func (f *Fabric) RouterNetns() string { return f.routerNetns() }

func (f *Fabric) routerNetns() string { return f.prefix + "-rtr" }

// NodeNetns returns the netns name of an instance ("<prefix>-<last 8 hex
// digits of its ID>"; its path is /var/run/netns/<name>), or "" when the
// fabric has not seen the instance's primary ENI attached.
func (f *Fabric) NodeNetns(instanceID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inst, ok := f.instances[instanceID]; ok {
		return inst.netns
	}
	return ""
}

// NetnsPath returns the bind-mount path of a named netns.
func NetnsPath(name string) string { return netnsPath(name) }

func netnsPath(name string) string { return netnsDir + "/" + name }

// instanceNetnsLocked picks the netns name of a new instance: the prefix and
// the last 8 hex digits of its ID, or the whole ID if those are taken.
func (f *Fabric) instanceNetnsLocked(instanceID string) string {
	short := strings.TrimPrefix(instanceID, "i-")
	if len(short) > 8 {
		short = short[len(short)-8:]
	}
	name := f.prefix + "-" + short
	for _, inst := range f.instances {
		if inst.netns == name {
			return f.prefix + "-" + instanceID
		}
	}
	return name
}

// routerLinkName names the router end of an ENI's veth: the prefix, "e" and
// 8 hex digits of the SHA-1 of the ENI ID: at most 15 characters, the
// kernel's limit.
func (f *Fabric) routerLinkName(eniID string) string {
	sum := sha1.Sum([]byte(eniID))
	return f.prefix + "e" + hex.EncodeToString(sum[:4])
}

// routerIndexBase is above every interface index of a router end: the
// kernel numbers an instance's links from 1 up, so no router end shares
// its index with its peer, eth<N> in the instance.
const routerIndexBase = 1 << 20

// routerIndexLocked picks the interface index of a new router end:
// routerIndexBase and up, so never its peer's. The kernel's link watcher
// handles a veth's carrier change at once only when the veth's index
// differs from its peer's index (linkwatch_urgent_event); otherwise it
// batches it, up to a second later. Until then the instance's eth<N> is not
// operational: its IPv6 is not ready (a TCP SYN arriving in that second was
// answered with ICMPv6 "no route") and packets the router sends into it
// are dropped.
func (f *Fabric) routerIndexLocked() int {
	if f.lastIndex < routerIndexBase {
		f.lastIndex = routerIndexBase
	}
	f.lastIndex++
	return f.lastIndex
}

// Listen opens a TCP listener inside the router netns, e.g. on
// IMDSAddr or EC2Addr. Close closes it with the fabric.
func (f *Fabric) Listen(addr string) (net.Listener, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("fabric: listen: closed")
	}
	var l net.Listener
	err := f.rtrNS.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fabric: listen %s in %s: %w", addr, f.routerNetns(), err)
	}
	f.listeners = append(f.listeners, l)
	return l, nil
}

// Close closes the listeners opened by Listen and removes every netns and
// link of the fabric. It is idempotent. Processes left running inside an
// instance netns keep it alive without its name; Cleanup kills them.
func (f *Fabric) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	for _, l := range f.listeners {
		l.Close() // the server may have closed it already
	}
	f.listeners = nil
	var errs []error
	for id := range f.instances {
		errs = append(errs, f.removeInstanceLocked(id))
	}
	if f.outside {
		errs = append(errs, deleteNetns(f.outsideNetns()))
		f.outside = false
	}
	errs = append(errs, f.closeRouter())
	return errors.Join(errs...)
}

// closeRouter releases the router's handles and deletes its netns.
func (f *Fabric) closeRouter() error {
	f.rtr.Close()
	if f.rtrNS != nil {
		f.rtrNS.Close()
	}
	return deleteNetns(f.routerNetns())
}

// hostAddr is a as a /32 interface address.
func hostAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, a.BitLen()))}
}

// ipNet converts p for netlink: the one place netip meets net.IP.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
