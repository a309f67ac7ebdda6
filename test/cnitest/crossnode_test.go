package cnitest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// TestCrossNodeVpcipd: two m5.large nodes (3 ENIs × 10 addresses) running
// vpcipd on vpcsim, 12 pods each, so each node has pods on its primary ENI
// (main table) and on a secondary ENI (rule 1536 into the ENI's table).
// Every kind reaches every kind on the other node through the fabric, whose
// strict rp_filter drops a packet leaving by the wrong ENI; and pods of both
// kinds reach the outside host with the node's primary address as source.
func TestCrossNodeVpcipd(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and two vpcipd")
	}
	v := startVPC(t, "m5.large", 2)
	outside, err := v.fab.EnableOutsideHost()
	if err != nil {
		t.Fatal(err)
	}
	envs := []*Env{NewEnv(t, v.nodes[0], v.daemons[0]), NewEnv(t, v.nodes[1], v.daemons[1])}
	kinds := make([]map[string]*Pod, 2) // per node: "primary", "secondary"
	var all [2][]*Pod
	for n, e := range envs {
		kinds[n] = map[string]*Pod{}
		for i := range 12 {
			p := e.NewPod(t, fmt.Sprintf("n%dp%d", n, i))
			e.MustAdd(t, p)
			all[n] = append(all[n], p)
			a := mustHeld(t, e, p)
			AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
			kind := "primary"
			if a.RouteTable != 0 {
				kind = "secondary"
			}
			kinds[n][kind] = p
		}
		if kinds[n]["primary"] == nil || kinds[n]["secondary"] == nil {
			t.Fatalf("node %d: 12 pods did not span the primary and a secondary ENI: %v", n, kinds[n])
		}
	}
	for _, from := range []string{"primary", "secondary"} {
		for _, to := range []string{"primary", "secondary"} {
			a, b := kinds[0][from], kinds[1][to]
			if err := ping(a.NetnsName, b.Address); err != nil {
				t.Errorf("node1 %s-ENI pod %v -> node2 %s-ENI pod %v: %v", from, a.Address, to, b.Address, err)
			}
			if err := ping(b.NetnsName, a.Address); err != nil {
				t.Errorf("node2 %s-ENI pod %v -> node1 %s-ENI pod %v: %v", to, b.Address, from, a.Address, err)
			}
		}
	}
	primary := v.insts[0].PrimaryENI.PrimaryIP
	srv := serveRemoteAddr(t, v.fab.OutsideNetns(), outside)
	for _, kind := range []string{"primary", "secondary"} {
		p := kinds[0][kind]
		got, err := dialFrom(p.NetnsName, srv)
		if err != nil {
			t.Errorf("%s-ENI pod %v -> outside %v: %v", kind, p.Address, srv, err)
			continue
		}
		if got != primary {
			t.Errorf("%s-ENI pod %v reached the outside host as %v, want the node's primary address %v", kind, p.Address, got, primary)
		}
	}
	for n, e := range envs {
		var wg sync.WaitGroup
		for _, p := range all[n] {
			wg.Go(func() {
				if err := e.Del(t, p); err != nil {
					t.Errorf("DEL %s: %v", p.Name, err)
				}
			})
		}
		wg.Wait()
		AssertNodeClean(t, e)
	}
}

// serveRemoteAddr listens on addr:7777 inside netns and answers every
// connection with the peer's address as it sees it.
func serveRemoteAddr(t *testing.T, netns string, addr netip.Addr) netip.AddrPort {
	t.Helper()
	ap := netip.AddrPortFrom(addr, 7777)
	var ln net.Listener
	err := ns.WithNetNSPath(filepath.Join(NetnsDir, netns), func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", ap.String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", netns, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, c.RemoteAddr().(*net.TCPAddr).IP.String())
			c.Close()
		}
	}()
	return ap
}

// dialFrom connects to srv from inside netns and returns the source address
// the server saw.
func dialFrom(netns string, srv netip.AddrPort) (netip.Addr, error) {
	var c net.Conn
	err := ns.WithNetNSPath(filepath.Join(NetnsDir, netns), func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", srv.String(), 3*time.Second)
		return err
	})
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(string(b))
}
