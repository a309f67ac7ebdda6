package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// ProbePort is the UDP port of the outside host's source-reporting echo.
const ProbePort = 7777

// StartSourceEcho serves, inside the outside host's netns, a UDP echo that
// answers every datagram with the source address it saw, so a test can tell
// what address a pod's traffic carried after SNAT. It stops with ctx.
func (c *Cluster) StartSourceEcho(ctx context.Context) error {
	if !c.Outside.IsValid() {
		return fmt.Errorf("the cluster has no outside host")
	}
	var conn net.PacketConn
	err := inNetns(c.Fabric.OutsideNetns(), func() error {
		var err error
		conn, err = net.ListenPacket("udp4", net.JoinHostPort(c.Outside.String(), strconv.Itoa(ProbePort)))
		return err
	})
	if err != nil {
		return fmt.Errorf("source echo: %w", err)
	}
	go func() { <-ctx.Done(); conn.Close() }()
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(from.String())
			_, _ = conn.WriteTo([]byte(host), from)
		}
	}()
	return nil
}

// SourceSeenOutside sends one datagram from the pod to the outside host's
// echo and returns the source address the outside host saw.
func (c *Cluster) SourceSeenOutside(ctx context.Context, p *podruntime.Pod) (netip.Addr, error) {
	var seen netip.Addr
	err := inNetns(p.Netns, func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		conn, err := d.DialContext(ctx, "udp4", net.JoinHostPort(c.Outside.String(), strconv.Itoa(ProbePort)))
		if err != nil {
			return err
		}
		defer conn.Close()
		buf := make([]byte, 64)
		for range 3 {
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			if _, err = conn.Write([]byte("who am i")); err != nil {
				continue
			}
			var n int
			if n, err = conn.Read(buf); err == nil {
				seen, err = netip.ParseAddr(strings.TrimSpace(string(buf[:n])))
				return err
			}
		}
		return err
	})
	return seen, err
}

// inNetns runs fn on an OS thread inside the named netns; sockets fn opens
// stay in that netns.
func inNetns(name string, fn func() error) error {
	h, err := ns.GetNS(filepath.Join(podruntime.NetnsDir, name))
	if err != nil {
		return err
	}
	defer h.Close()
	return h.Do(func(ns.NetNS) error { return fn() })
}
