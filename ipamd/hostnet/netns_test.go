package hostnet

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/test/netnsdir"
)

var nsSeq atomic.Int64

// needRoot skips tests that create network namespaces when not root.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command")
	}
}

// testNS is a throwaway named network namespace ("vht-..."), deleted with
// everything in it when the test ends.
type testNS struct {
	name string
	ns   ns.NetNS
}

func newNS(t testing.TB, role string) *testNS {
	t.Helper()
	name := fmt.Sprintf("vht-%s-%d-%d", role, os.Getpid(), nsSeq.Add(1))
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netnsdir.Delete(name); err != nil {
			t.Error(err)
		}
	})
	h, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	n := &testNS{name: name, ns: h}
	n.run(t, "ip", "link", "set", "lo", "up")
	return n
}

// do runs f on a goroutine locked into the namespace.
func (n *testNS) do(t testing.TB, f func() error) {
	t.Helper()
	if err := n.ns.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// run runs a command inside the namespace and returns its output.
func (n *testNS) run(t testing.TB, args ...string) string {
	t.Helper()
	full := append([]string{"netns", "exec", n.name}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// lines runs a command in the namespace and returns its non-empty output
// lines, trimmed.
func (n *testNS) lines(t testing.TB, args ...string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(n.run(t, args...), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return out
}

// addVeth creates a veth pair inside the namespace, standing in for an ENI
// (the kernel here has no dummy links): name carries mac; the peer is up so
// the link has carrier once it is set up.
func (n *testNS) addVeth(t testing.TB, name, mac, peer string) {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	n.do(t, func() error {
		return netlink.LinkAdd(&netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: hw},
			PeerName:  peer,
		})
	})
	n.run(t, "ip", "link", "set", peer, "up")
}

var commentPattern = regexp.MustCompile(` -m comment --comment ("[^"]*"|\S+)`)

// iptRules returns the "-A" lines of an iptables table (iptables -S),
// without our comments, and counts the lines carrying a vpcip comment.
func (n *testNS) iptRules(t *testing.T, table string) []string {
	t.Helper()
	var out []string
	for _, l := range n.lines(t, "iptables", "-w", "-t", table, "-S") {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, commentPattern.ReplaceAllString(l, ""))
		}
	}
	return out
}
