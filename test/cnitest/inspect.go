package cnitest

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The harness reads state with iproute2's JSON output (`ip -n <netns> -j`),
// an observer independent of the netlink code under test.

type ipLink struct {
	IfName   string   `json:"ifname"`
	MTU      int      `json:"mtu"`
	Address  string   `json:"address"`
	Flags    []string `json:"flags"`
	LinkType string   `json:"link_type"`
	IfAlias  string   `json:"ifalias"`
}

type ipAddr struct {
	AddrInfo []struct {
		Family    string `json:"family"`
		Local     string `json:"local"`
		PrefixLen int    `json:"prefixlen"`
	} `json:"addr_info"`
}

type ipRoute struct {
	Dst     string `json:"dst"`
	Gateway string `json:"gateway"`
	Dev     string `json:"dev"`
	Scope   string `json:"scope"`
	Table   string `json:"table"`
}

type ipNeigh struct {
	Dst    string   `json:"dst"`
	Dev    string   `json:"dev"`
	LLAddr string   `json:"lladdr"`
	State  []string `json:"state"`
}

type ipRule struct {
	Priority int    `json:"priority"`
	Src      string `json:"src"`
	SrcLen   int    `json:"srclen"`
	Dst      string `json:"dst"`
	DstLen   int    `json:"dstlen"`
	Table    string `json:"table"`
}

// ipJSON runs `ip -n netns -j args...` and decodes its output into v.
func ipJSON(t testing.TB, netns string, v any, args ...string) {
	t.Helper()
	full := append([]string{"-n", netns, "-j"}, args...)
	out, err := exec.Command("ip", full...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("ip %s: %v %s", strings.Join(full, " "), err, stderr)
	}
	if len(strings.TrimSpace(string(out))) == 0 {
		out = []byte("[]")
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("ip %s: decode %q: %v", strings.Join(full, " "), out, err)
	}
}

// Links lists the links of a netns.
func links(t testing.TB, netns string) []ipLink {
	var l []ipLink
	ipJSON(t, netns, &l, "link", "show")
	return l
}

func linkNamed(t testing.TB, netns, name string) (ipLink, bool) {
	for _, l := range links(t, netns) {
		if l.IfName == name {
			return l, true
		}
	}
	return ipLink{}, false
}

func rules(t testing.TB, netns string) []ipRule {
	var r []ipRule
	ipJSON(t, netns, &r, "-4", "rule", "show")
	return r
}

// PodRules returns the node's rules at priorities 512 and 1536 for addr, as
// "512 to <addr>/32 main" / "1536 from <addr>/32 <table>".
func PodRules(t testing.TB, node string, addr netip.Addr) []string {
	var out []string
	for _, r := range rules(t, node) {
		// ip omits the prefix length of a host (/32) selector.
		switch {
		case r.Priority == 512 && r.Dst == addr.String() && (r.DstLen == 32 || r.DstLen == 0):
			out = append(out, fmt.Sprintf("512 to %s/32 %s", r.Dst, r.Table))
		case r.Priority == 1536 && r.Src == addr.String() && (r.SrcLen == 32 || r.SrcLen == 0):
			out = append(out, fmt.Sprintf("1536 from %s/32 %s", r.Src, r.Table))
		}
	}
	slices.Sort(out)
	return out
}

// WantRules is what docs/design.md §4 asks for an address in routeTable (0: main).
func WantRules(addr netip.Addr, routeTable int) []string {
	out := []string{fmt.Sprintf("512 to %s/32 main", addr)}
	if routeTable != 0 {
		out = append(out, fmt.Sprintf("1536 from %s/32 %d", addr, routeTable))
	}
	slices.Sort(out)
	return out
}

// HostRoute returns the main-table route to addr/32 in the node, if any.
func HostRoute(t testing.TB, node string, addr netip.Addr) (ipRoute, bool) {
	var rs []ipRoute
	ipJSON(t, node, &rs, "-4", "route", "show", "table", "main", "exact", addr.String()+"/32")
	if len(rs) == 0 {
		return ipRoute{}, false
	}
	return rs[0], true
}
