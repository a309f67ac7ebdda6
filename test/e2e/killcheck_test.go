package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/netnsdir"
)

// hostLink is a link of `ip -j link show`, with its alias (the sandbox a
// host veth wires).
type hostLink struct {
	IfName  string `json:"ifname"`
	IfAlias string `json:"ifalias"`
}

type hostRoute struct {
	Dst string `json:"dst"`
	Dev string `json:"dev"`
}

type hostRule struct {
	Priority int    `json:"priority"`
	Src      string `json:"src"`
	Dst      string `json:"dst"`
}

type podAddr struct {
	AddrInfo []struct {
		Local string `json:"local"`
	} `json:"addr_info"`
}

func ipJSON(ctx context.Context, netns string, v any, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", netns, "-j"}, args...)...).Output()
	if err != nil {
		return fmt.Errorf("ip -n %s %s: %w", netns, strings.Join(args, " "), err)
	}
	if len(strings.TrimSpace(string(out))) == 0 {
		return nil
	}
	return json.Unmarshal(out, v)
}

// nodeView is what a node's kernel and daemon show.
type nodeView struct {
	aliases  map[string]string     // host veth → alias
	routes   map[netip.Addr]string // pod /32 → host veth
	rules    map[netip.Addr]int    // address → pod rules (512/1536)
	daemon   map[netip.Addr]string // address → holder's container ID
	recorded map[string]netip.Addr // container ID → address
}

func viewNode(t *testing.T, ctx context.Context, n *cluster.Node) nodeView {
	t.Helper()
	v := nodeView{aliases: map[string]string{}, routes: map[netip.Addr]string{}, rules: map[netip.Addr]int{},
		daemon: map[netip.Addr]string{}, recorded: map[string]netip.Addr{}}
	var links []hostLink
	var routes []hostRoute
	var rules []hostRule
	for _, err := range []error{
		ipJSON(ctx, n.Netns, &links, "link", "show", "type", "veth"),
		ipJSON(ctx, n.Netns, &routes, "-4", "route", "show", "table", "main", "scope", "link"),
		ipJSON(ctx, n.Netns, &rules, "-4", "rule", "show"),
	} {
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
	}
	for _, l := range links {
		if strings.HasPrefix(l.IfName, "eni") {
			v.aliases[l.IfName] = l.IfAlias
		}
	}
	for _, r := range routes {
		if a, err := netip.ParseAddr(r.Dst); err == nil && strings.HasPrefix(r.Dev, "eni") {
			v.routes[a] = r.Dev
		}
	}
	for _, r := range rules {
		if r.Priority != 512 && r.Priority != 1536 {
			continue
		}
		for _, s := range []string{r.Src, r.Dst} {
			if a, err := netip.ParseAddr(s); err == nil {
				v.rules[a]++
			}
		}
	}
	out, err := n.Ctl(ctx, "pods", "-o", "json")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	var pods introspect.Pods
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		t.Fatalf("%s: vpcipctl pods -o json: %v", n.Name, err)
	}
	for _, a := range pods.Assignments {
		if prev, dup := v.daemon[a.Address]; dup {
			t.Errorf("%s: daemon lists %v twice (%s and %s)", n.Name, a.Address, prev, a.Key.ContainerID)
		}
		v.daemon[a.Address] = a.Key.ContainerID
		v.recorded[a.Key.ContainerID] = a.Address
	}
	return v
}

// podAddress is the IPv4 address on the sandbox's eth0, as its netns shows.
func podAddress(ctx context.Context, netns string) (netip.Addr, error) {
	var addrs []podAddr
	if err := ipJSON(ctx, netns, &addrs, "-4", "addr", "show", "dev", "eth0"); err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		for _, ai := range a.AddrInfo {
			return netip.ParseAddr(ai.Local)
		}
	}
	return netip.Addr{}, fmt.Errorf("no IPv4 address on eth0 in %s", netns)
}

// checkInvariants: every live sandbox has its own address (across nodes),
// is wired (its eth0 holds it; the host routes it to a veth that names the
// sandbox; its rules exist) and its daemon records it under its own key
// (also after a lost checkpoint: the veth names the sandbox); no other
// sandbox's record holds a live sandbox's address.
func checkInvariants(t *testing.T, ctx context.Context, c *cluster.Cluster, nodes []*churner, when string) {
	t.Helper()
	users := map[netip.Addr]string{}
	for _, ch := range nodes {
		v := viewNode(t, ctx, ch.node)
		ch.mu.Lock()
		live := append([]*sandbox(nil), ch.live...)
		ch.mu.Unlock()
		for _, s := range live {
			p := s.pod
			id := fmt.Sprintf("%s %s/%s (%s)", ch.node.Name, p.Name, p.ContainerID[:12], p.Address)
			got, err := podAddress(ctx, p.Netns)
			if err != nil || got != p.Address {
				t.Errorf("%s: live sandbox %s: eth0 shows %v (%v)", when, id, got, err)
			}
			if other, dup := users[p.Address]; dup {
				t.Errorf("%s: address %v on two live sandboxes: %s and %s", when, p.Address, other, id)
			}
			users[p.Address] = id
			veth := v.routes[p.Address]
			want := "vpcip " + p.Network + "/" + p.ContainerID + "/" + p.IfName
			if veth == "" || v.aliases[veth] != want {
				t.Errorf("%s: live sandbox %s: host route to %q whose alias is %q, want %q", when, id, veth, v.aliases[veth], want)
			}
			if v.rules[p.Address] == 0 {
				t.Errorf("%s: live sandbox %s: no policy rule for its address", when, id)
			}
			holder, held := v.daemon[p.Address]
			switch {
			case !held:
				t.Errorf("%s: live sandbox %s: the daemon holds nothing for its address", when, id)
			case holder != p.ContainerID:
				t.Errorf("%s: live sandbox %s: its address is recorded for container %s", when, id, holder)
			}
			if a, ok := v.recorded[p.ContainerID]; ok && a != p.Address {
				t.Errorf("%s: live sandbox %s: recorded with %v", when, id, a)
			}
		}
	}
}

// assertNoLeak: after the runtime deleted everything and ran GC, no node
// holds an assignment, a pod veth, route or rule, and no pod netns is left.
// Records the daemon re-held from host routes after a lost checkpoint, whose
// sandboxes went without a DEL, are released by its reconciliation (two
// rounds of VPCIP_RECONCILE_INTERVAL without a route): it gets 20 s.
func assertNoLeak(t *testing.T, ctx context.Context, c *cluster.Cluster, nodes []*churner) {
	t.Helper()
	for _, ch := range nodes {
		var leaks []string
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			leaks = nodeLeaks(t, ctx, ch)
			if len(leaks) == 0 || time.Now().After(deadline) {
				break
			}
		}
		for _, l := range leaks {
			t.Errorf("%s: leaked: %s", ch.node.Name, l)
		}
		if err := netnsdir.DeletePrefix(ch.node.Runtime.Prefix + "-"); err != nil {
			t.Errorf("%s: %v", ch.node.Name, err)
		}
	}
}

func nodeLeaks(t *testing.T, ctx context.Context, ch *churner) []string {
	v := viewNode(t, ctx, ch.node)
	var leaks []string
	for a, k := range v.daemon {
		leaks = append(leaks, fmt.Sprintf("daemon holds %v for %s", a, k))
	}
	for l := range v.aliases {
		leaks = append(leaks, "host veth "+l)
	}
	for a, l := range v.routes {
		leaks = append(leaks, fmt.Sprintf("route %v via %s", a, l))
	}
	for a, n := range v.rules {
		leaks = append(leaks, fmt.Sprintf("%d rules for %v", n, a))
	}
	entries, _ := os.ReadDir(netnsdir.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ch.node.Runtime.Prefix+"-") {
			leaks = append(leaks, "pod netns "+e.Name())
		}
	}
	return leaks
}
