package cnitest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/test/netnsdir"
)

// NetnsDir is where named netns are bind-mounted, as `ip netns add` does.
const NetnsDir = "/var/run/netns"

// Node is the network namespace the plugin runs in: the node's, where host
// veths, host routes and rules live.
type Node struct {
	Name string // netns name under NetnsDir
	NS   ns.NetNS
}

// Path is the node netns path.
func (n *Node) Path() string { return filepath.Join(NetnsDir, n.Name) }

// Do runs fn with the calling goroutine in the node netns (exec'd children
// inherit it).
func (n *Node) Do(fn func() error) error {
	return n.NS.Do(func(ns.NetNS) error { return fn() })
}

// NewNode creates a fresh node netns "vct-node-<rand>" with lo up, removed
// at cleanup. It has no link to anything else, and IPv4 forwarding is off as
// in any new netns: the plugin must turn it on.
func NewNode(t testing.TB) *Node {
	t.Helper()
	name := NewNetns(t, "vct-node-")
	n := OpenNode(t, name)
	err := n.Do(func() error {
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("set up node netns %s: %v", name, err)
	}
	return n
}

// OpenNode opens an existing netns (a vpcsim instance) as a Node.
func OpenNode(t testing.TB, name string) *Node {
	t.Helper()
	h, err := ns.GetNS(filepath.Join(NetnsDir, name))
	if err != nil {
		t.Fatalf("open node netns %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	return &Node{Name: name, NS: h}
}

// NewNetns creates "<prefix><8 hex>" (netnsdir) and deletes it at
// cleanup (an already deleted netns is fine). prefix must start with "vct-".
func NewNetns(t testing.TB, prefix string) string {
	t.Helper()
	if !strings.HasPrefix(prefix, "vct-") {
		t.Fatalf("netns prefix %q must start with vct-", prefix)
	}
	name := prefix + randomHex(4)
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DeleteNetns(name) })
	return name
}

// DeleteNetns removes a named netns; a missing one is fine.
func DeleteNetns(name string) { _ = netnsdir.Delete(name) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}
