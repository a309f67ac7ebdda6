// Package containerd_test runs pod sandboxes through a real containerd (CRI
// plugin + runc), driven over CRI as the kubelet drives it, on nodes made
// of network namespaces. The control scenarios use the reference bridge +
// host-local conflist, so a failure of the vpcip scenarios can be told apart
// from a problem of the runtime setup.
package containerd_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/netnsdir"
)

// netnsPrefix starts the name of every network namespace these tests make.
const netnsPrefix = "vcr-"

// forEachRuntime runs fn as a subtest per containerd release: "debian"
// (Debian's containerd 1.6 and runc, CNI results up to 1.0.0) and
// "containerd2" (built from source, CNI 1.1.0). A subtest skips when its
// runtime is not set up, unless VPCIP_REQUIRE_CONTAINERD=1 (debian) or
// VPCIP_REQUIRE_CONTAINERD2=1 (containerd2) says CI set it up, in which case
// it fails. All of them need root and skip in -short mode.
func forEachRuntime(t *testing.T, fn func(t *testing.T, tools crinode.Tools)) {
	if testing.Short() {
		t.Skip("containerd scenarios take tens of seconds; skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("containerd scenarios need root (network namespaces, runc)")
	}
	for _, rt := range []struct{ label, dir, require string }{
		{"debian", "", "VPCIP_REQUIRE_CONTAINERD"},
		{"containerd2", crinode.Containerd2Dir(), "VPCIP_REQUIRE_CONTAINERD2"},
	} {
		t.Run(rt.label, func(t *testing.T) {
			tools, err := crinode.FindTools(rt.dir)
			if err != nil {
				if os.Getenv(rt.require) == "1" {
					t.Fatalf("%s=1 but the runtime is not set up: %v", rt.require, err)
				}
				t.Skipf("container runtime not set up (%v)", err)
			}
			fn(t, tools)
		})
	}
}

var netnsSeq atomic.Int32

// newNetns makes a throwaway network namespace with lo up, removed at cleanup.
func newNetns(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("%s%d-%d", netnsPrefix, os.Getpid()%100000, netnsSeq.Add(1))
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netnsdir.Delete(name); err != nil {
			t.Error(err)
		}
	})
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
	return name
}

// startNode starts a containerd inside the named netns with the reference
// plugins linked into its CNI bin dir. It is closed, and its directory
// removed, at cleanup; containerd's log is shown when the test failed.
func startNode(t testing.TB, tools crinode.Tools, netnsName string, plugins ...string) *crinode.Node {
	t.Helper()
	dir, err := os.MkdirTemp("", netnsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	n, err := crinode.Start(context.Background(), crinode.Config{Dir: dir, Netns: netnsName, Tools: tools, Plugins: plugins})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log of %s (last lines):\n%s", netnsName, n.LogTail(40))
		}
		if err := n.Close(); err != nil {
			t.Errorf("close containerd in %s: %v", netnsName, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return n
}

// linkAddrs returns the IPv4 addresses of the named link inside the network
// namespace at nsPath.
func linkAddrs(t testing.TB, nsPath, link string) []netip.Addr {
	t.Helper()
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatalf("open netns %s: %v", nsPath, err)
	}
	defer h.Close()
	nl, err := netlinksafe.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	l, err := nl.LinkByName(link)
	if err != nil {
		t.Fatalf("%s in %s: %v", link, nsPath, err)
	}
	list, err := nl.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out = append(out, ip)
		}
	}
	return out
}

// podNetnsPath is the network namespace of a running sandbox, through its
// pause process (the path containerd made may live in its mount namespace).
func podNetnsPath(sb crinode.Sandbox) string {
	return fmt.Sprintf("/proc/%d/ns/net", sb.PID)
}

// exchange opens a TCP listener on dst's address inside dst's netns, connects
// to it from inside src's netns, and checks that a message goes there and
// back: real traffic between two sandboxes over the datapath under test.
func exchange(t *testing.T, src, dst crinode.Sandbox) {
	t.Helper()
	var ln net.Listener
	err := ns.WithNetNSPath(podNetnsPath(dst), func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(dst.IP, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", dst.Pod.Name, err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		fmt.Fprintf(c, "%s from %s", buf[:n], c.LocalAddr())
	}()
	var reply string
	err = ns.WithNetNSPath(podNetnsPath(src), func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(c, "hello %s", src.IP); err != nil {
			return err
		}
		buf := make([]byte, 128)
		n, err := c.Read(buf)
		reply = string(buf[:n])
		if n > 0 {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s (%s) -> %s (%s): %v", src.Pod.Name, src.IP, dst.Pod.Name, dst.IP, err)
	}
	want := fmt.Sprintf("hello %s from %s", src.IP, ln.Addr())
	if reply != want {
		t.Fatalf("%s -> %s: reply %q, want %q", src.Pod.Name, dst.Pod.Name, reply, want)
	}
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// hostLocalReserved lists the addresses the host-local IPAM store of the
// named network holds (one file per address, named by it).
func hostLocalReserved(t testing.TB, dataDir, network string) []netip.Addr {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, network))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, e := range entries {
		if a, err := netip.ParseAddr(e.Name()); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// podName gives the i-th pod a name, namespace and UID.
func podName(prefix string, i int) crinode.Pod {
	return crinode.Pod{
		Name:      fmt.Sprintf("%s-%02d", prefix, i),
		Namespace: []string{"default", "team-a", "team-b"}[i%3],
		UID:       fmt.Sprintf("%s-uid-%04d", strings.ReplaceAll(prefix, "-", ""), i),
	}
}
