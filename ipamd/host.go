package ipamd

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/routing"
)

// Host is the node's networking as the daemon drives it: package hostnet on a
// real node (NodeHost), nothing at all when VPCIP_HOSTNET=false (NoHost).
type Host interface {
	// EnsureENI sets up a secondary ENI's link, route table and rule and
	// returns its link name.
	EnsureENI(e hostnet.ENI) (string, error)
	// RemoveENI removes what EnsureENI made; missing is success.
	RemoveENI(e hostnet.ENI) error
	// EnsureSNAT installs the SNAT and connection-mark rules.
	EnsureSNAT(c hostnet.SNATConfig) error
	// EnsureIMDSBlock installs the filter keeping pods from the instance
	// metadata service, except c.Allowed.
	EnsureIMDSBlock(c hostnet.IMDSConfig) error
	// RemoveIMDSBlock removes it; missing is success.
	RemoveIMDSBlock() error
	// EnsureAcceptRA keeps router advertisements in effect on the link
	// (accept_ra=2) while the node forwards IPv6 (IPv6 mode).
	EnsureAcceptRA(link string) error
	// LinkName is the name of the link with this MAC (the primary ENI's, for SNAT).
	LinkName(mac string) (string, error)
	// PodRoutes lists the host routes to pod veths. ErrNoHostView means the
	// host cannot be observed, which is not the same as "no pods".
	PodRoutes() ([]hostnet.PodRoute, error)
	// RemovePodRules deletes the plugin's per-pod policy rules of an
	// address released without a DEL; it returns how many rules it deleted.
	RemovePodRules(addr netip.Addr) (int, error)
	// FlushConntrack deletes the connection-tracking entries of addrs (one
	// dump of the table for all); it returns how many it deleted.
	FlushConntrack(addrs []netip.Addr) (uint, error)
	// PodRuleAddresses lists the addresses with per-pod policy rules.
	PodRuleAddresses() ([]netip.Addr, error)
	// LinkExists reports whether the node netns has a link of this name (a
	// pod's host veth: it goes with its sandbox's netns). An error means
	// the answer is unknown.
	LinkExists(name string) (bool, error)
}

// ErrNoHostView: the daemon runs without host networking and cannot see pods.
var ErrNoHostView = errors.New("host networking disabled (VPCIP_HOSTNET=false): no view of pod routes")

// NodeHost is Host on the current network namespace through package hostnet.
type NodeHost struct {
	// SysctlNet is where the node's net sysctls are written
	// (VPCIP_SYSCTL_NET_DIR); "" is hostnet.DefaultSysctlNet.
	SysctlNet string
}

var _ Host = NodeHost{}

func (h NodeHost) EnsureENI(e hostnet.ENI) (string, error) {
	e.SysctlNet = h.SysctlNet
	return hostnet.EnsureENI(e)
}
func (NodeHost) RemoveENI(e hostnet.ENI) error { return hostnet.RemoveENI(e) }
func (h NodeHost) EnsureSNAT(c hostnet.SNATConfig) error {
	c.SysctlNet = h.SysctlNet
	return hostnet.EnsureSNAT(c)
}
func (NodeHost) EnsureIMDSBlock(c hostnet.IMDSConfig) error { return hostnet.EnsureIMDSBlock(c) }
func (h NodeHost) EnsureAcceptRA(link string) error         { return hostnet.EnsureAcceptRA(h.SysctlNet, link) }
func (NodeHost) RemoveIMDSBlock() error                     { return hostnet.RemoveIMDSBlock() }
func (NodeHost) LinkName(mac string) (string, error)        { return linkByMAC(mac) }
func (NodeHost) PodRoutes() ([]hostnet.PodRoute, error)     { return hostnet.PodRoutes() }

func (NodeHost) RemovePodRules(a netip.Addr) (int, error) { return routing.RemovePodRules(a) }
func (NodeHost) FlushConntrack(addrs []netip.Addr) (uint, error) {
	return hostnet.FlushConntrack(addrs)
}
func (NodeHost) PodRuleAddresses() ([]netip.Addr, error) { return routing.PodRuleAddresses() }
func (NodeHost) LinkExists(name string) (bool, error)    { return hostnet.LinkExists(name) }

// NoHost is Host for VPCIP_HOSTNET=false (tests and development without root):
// it changes nothing and sees no pods.
type NoHost struct{}

var _ Host = NoHost{}

func (NoHost) EnsureENI(e hostnet.ENI) (string, error)   { return "", nil }
func (NoHost) RemoveENI(hostnet.ENI) error               { return nil }
func (NoHost) EnsureSNAT(hostnet.SNATConfig) error       { return nil }
func (NoHost) EnsureIMDSBlock(hostnet.IMDSConfig) error  { return nil }
func (NoHost) RemoveIMDSBlock() error                    { return nil }
func (NoHost) EnsureAcceptRA(string) error               { return nil }
func (NoHost) LinkName(string) (string, error)           { return "", nil }
func (NoHost) PodRoutes() ([]hostnet.PodRoute, error)    { return nil, ErrNoHostView }
func (NoHost) RemovePodRules(netip.Addr) (int, error)    { return 0, nil }
func (NoHost) FlushConntrack([]netip.Addr) (uint, error) { return 0, nil }
func (NoHost) PodRuleAddresses() ([]netip.Addr, error)   { return nil, nil }
func (NoHost) LinkExists(string) (bool, error)           { return false, ErrNoHostView }

func linkByMAC(mac string) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list interfaces: %w", err)
	}
	for _, i := range ifs {
		if strings.EqualFold(i.HardwareAddr.String(), mac) {
			return i.Name, nil
		}
	}
	return "", fmt.Errorf("no interface has the primary ENI's MAC %s", mac)
}
