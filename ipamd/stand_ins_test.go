package ipamd

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/provider"
)

// memHost stands in for the node's routing state in tests without root: the
// pod routes the plugin would have made. (hostnet itself is tested in real
// network namespaces in its own package.)
type memHost struct {
	mu       sync.Mutex
	routes   map[netip.Addr]string // pod address → host veth
	links    map[string]bool       // host veths present
	acceptRA []string              // links EnsureAcceptRA was called for, in order
	enis     map[string]hostnet.ENI

	rulesRemoved []netip.Addr        // addresses whose pod rules the daemon asked to remove
	rules        map[netip.Addr]bool // addresses with staged per-pod rules
	imds         *hostnet.IMDSConfig // the pod IMDS filter applied; nil: none
}

var _ Host = (*memHost)(nil)

func newMemHost() *memHost {
	return &memHost{routes: map[netip.Addr]string{}, links: map[string]bool{}, enis: map[string]hostnet.ENI{}}
}

func (h *memHost) EnsureENI(e hostnet.ENI) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enis[e.MAC] = e
	return "eth" + string(rune('0'+e.DeviceNumber)), nil
}

func (h *memHost) RemoveENI(e hostnet.ENI) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.enis, e.MAC)
	return nil
}

func (h *memHost) LinkName(string) (string, error) { return "eth0", nil }

func (h *memHost) EnsureSNAT(hostnet.SNATConfig) error { return nil }

func (h *memHost) EnsureAcceptRA(link string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acceptRA = append(h.acceptRA, link)
	return nil
}

func (h *memHost) FlushConntrack([]netip.Addr) (uint, error) { return 0, nil }

func (h *memHost) RemovePodRules(a netip.Addr) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rulesRemoved = append(h.rulesRemoved, a)
	n := 0
	if h.rules[a] {
		n = 1
		delete(h.rules, a)
	}
	return n, nil
}

func (h *memHost) PodRuleAddresses() ([]netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]netip.Addr, 0, len(h.rules))
	for a := range h.rules {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// leaveRules stages per-pod rules of a, as a plugin killed mid-DEL leaves them.
func (h *memHost) leaveRules(a netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rules == nil {
		h.rules = map[netip.Addr]bool{}
	}
	h.rules[a] = true
}

func (h *memHost) PodRoutes() ([]hostnet.PodRoute, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hostnet.PodRoute
	for a, v := range h.routes {
		out = append(out, hostnet.PodRoute{Address: a, HostVeth: v})
	}
	slices.SortFunc(out, func(a, b hostnet.PodRoute) int { return a.Address.Compare(b.Address) })
	return out, nil
}

// wire records a pod's host veth and route, as the plugin's ADD would.
func (h *memHost) wire(a netip.Addr, veth string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.routes[a] = veth
	h.links[veth] = true
}

// unwire removes a pod's route and host veth, as the plugin's DEL (or a
// vanished netns) would.
func (h *memHost) unwire(a netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.links, h.routes[a])
	delete(h.routes, a)
}

func (h *memHost) LinkExists(name string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.links[name], nil
}

// stagedMetadata is the real provider with instance metadata replaced by
// what the test stages (docs/field-failures.md "fake metadata"); every other call,
// EC2 included, goes to vpcsim.
type stagedMetadata struct {
	provider.Provider
	mu    sync.Mutex
	stage func([]provider.ENI) []provider.ENI // nil: the real metadata
}

func (s *stagedMetadata) set(f func([]provider.ENI) []provider.ENI) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stage = f
}

func (s *stagedMetadata) MetadataENIs(ctx context.Context) ([]provider.ENI, error) {
	enis, err := s.Provider.MetadataENIs(ctx)
	s.mu.Lock()
	f := s.stage
	s.mu.Unlock()
	if err != nil || f == nil {
		return enis, err
	}
	return f(enis), nil
}

// gatedENIs is the real provider whose EC2 ENI listing waits for a gate: a
// cloud slow to answer while the daemon starts.
type gatedENIs struct {
	provider.Provider
	gate chan struct{}
}

func (g *gatedENIs) ENIs(ctx context.Context) ([]provider.ENI, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Provider.ENIs(ctx)
}

// flush forgets the ENI setups, as if someone flushed the host's tables.
func (h *memHost) flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.enis)
}

func (h *memHost) enisSetUp() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.enis)
}

func (h *memHost) EnsureIMDSBlock(c hostnet.IMDSConfig) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.imds = &c
	return nil
}

func (h *memHost) RemoveIMDSBlock() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.imds = nil
	return nil
}
