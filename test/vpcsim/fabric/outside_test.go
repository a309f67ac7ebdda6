package fabric

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

func TestOutsideHost(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	if _, err := f.EnableOutsideHost(); err != nil {
		t.Fatal(err)
	}
	got, err := f.EnableOutsideHost() // twice is harmless
	if err != nil || got != OutsideAddr {
		t.Fatalf("EnableOutsideHost = %v, %v; want %v", got, err, OutsideAddr)
	}
	// A secondary IP of A's primary ENI: routed, but not a primary address.
	secondary := netip.MustParseAddr("100.64.0.60")
	f.AddressesAssigned(eniA0, []netip.Prefix{netip.PrefixFrom(secondary, 32)})
	nsA := f.NodeNetns(instA)
	h := handleIn(t, nsA)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(eth0, hostAddr(secondary)); err != nil {
		t.Fatal(err)
	}
	at := listenUDP(t, f.OutsideNetns(), netip.AddrPortFrom(OutsideAddr, 9000))
	to := netip.AddrPortFrom(OutsideAddr, 9000)

	sendUDP(t, nsA, primaryA, "", to, "from primary")
	if !receive(t, at, "from primary", 5*time.Second) {
		t.Error("packet from a primary address did not reach the outside host")
	}
	sendUDP(t, nsA, secondary, "", to, "from secondary")
	if receive(t, at, "from secondary", wait) {
		t.Error("packet from a secondary address reached the outside host")
	}
	if got := outsideRuleSources(t, f); len(got) != 2 {
		t.Errorf("outside rules from %v, want A's and B's primary", got)
	}
	f.InstanceTerminated(instA)
	if got := outsideRuleSources(t, f); len(got) != 1 || got[0] != primaryB {
		t.Errorf("outside rules after terminating A from %v, want %v", got, primaryB)
	}
}

// outsideRuleSources lists the sources the router's rules let reach the
// outside host.
func outsideRuleSources(t *testing.T, f *Fabric) []netip.Addr {
	t.Helper()
	rtr := handleIn(t, f.RouterNetns())
	rules, err := rtr.RuleList(netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var srcs []netip.Addr
	for _, r := range rules {
		if r.Table == outsideTable && r.Src != nil {
			a, _ := netip.AddrFromSlice(r.Src.IP.To4())
			srcs = append(srcs, a)
		}
	}
	return srcs
}

// TestListenServesInstances serves HTTP inside the router netns and calls
// it from an instance: the server sees the instance's primary address, by
// which IMDS tells instances apart.
func TestListenServesInstances(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	l, err := f.Listen(EC2Addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.RemoteAddr)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	for inst, want := range map[string]netip.Addr{instA: primaryA, instB: primaryB} {
		body := getFrom(t, f.NodeNetns(inst), EC2URL+"/")
		ap, err := netip.ParseAddrPort(body)
		if err != nil || ap.Addr() != want {
			t.Errorf("%s: server saw %q, want %s", inst, body, want)
		}
	}
}

// getFrom GETs url over a connection made inside the named netns.
func getFrom(t *testing.T, netnsName, url string) string {
	t.Helper()
	tr := &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.WithNetNSPath(netnsPath(netnsName), func(ns.NetNS) error {
			var err error
			c, err = net.DialTimeout(network, addr, 5*time.Second)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s from %s: %v", url, netnsName, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCleanupAfterCrash leaves a fabric unclosed, with a process running in
// an instance netns, as a crashed `vpcsim up` would, and checks Cleanup
// removes the netns and the process.
func TestCleanupAfterCrash(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	if _, err := f.EnableOutsideHost(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", f.NodeNetns(instA), "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	waitInNetns(t, cmd.Process.Pid, f.NodeNetns(instA))

	if err := Cleanup(f.Prefix()); err != nil {
		t.Fatal(err)
	}
	if left := netnsWithPrefix(t, f.Prefix()); len(left) != 0 {
		t.Errorf("netns left: %v", left)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("process in the instance netns still runs after Cleanup")
	}
	if err := Cleanup(f.Prefix()); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}

// waitInNetns waits until the process has entered the named netns (ip netns
// exec switches before it execs).
func waitInNetns(t *testing.T, pid int, name string) {
	t.Helper()
	want, err := os.Stat(netnsPath(name))
	if err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if got, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && os.SameFile(got, want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d never entered %s", pid, name)
}

func TestNewRejectsBadPrefix(t *testing.T) {
	for _, p := range []string{"", "Vsim", "1abc", "toolong", "a-b", "a/b"} {
		if f, err := New(p); err == nil {
			f.Close()
			t.Errorf("New(%q) succeeded", p)
		}
		if err := Cleanup(p); err == nil {
			t.Errorf("Cleanup(%q) succeeded", p)
		}
	}
}

func TestIsRouterEnd(t *testing.T) {
	f := &Fabric{prefix: "vs"}
	tests := []struct {
		name string
		want bool
	}{
		{f.routerLinkName("eni-0123456789abcdef0"), true},
		{"vsout", true},
		{"vsr701abcdef", false}, // another prefix that starts the same
		{"vse1234567", false},   // too short
		{"vse1234567z", false},  // not hex
		{"eth0", false},
	}
	for _, tt := range tests {
		if got := isRouterEnd("vs", tt.name); got != tt.want {
			t.Errorf("isRouterEnd(vs, %q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
