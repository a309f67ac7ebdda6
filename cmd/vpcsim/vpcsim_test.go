package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// buildVpcsim builds this command into a temporary directory.
func buildVpcsim(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vpcsim")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// leftovers lists what of a vpcsim with this prefix is visible from the
// host: netns "<prefix>-*", host links named "<prefix>*", and host routes to
// the fabric's metadata address or outside range (the fabric must never be
// linked to the host). Other tests on the machine may change unrelated host
// state meanwhile, so only these are compared.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	var left []string
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			left = append(left, "netns "+e.Name())
		}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: syscall.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones > 0 && (r.Dst.Contains(net.ParseIP(fabric.MetadataAddr)) || r.Dst.Contains(fabric.OutsideAddr.AsSlice())) {
			left = append(left, "route "+r.String())
		}
	}
	return left
}

// TestUpDown runs `vpcsim up`, uses it, and stops it with `vpcsim down`,
// once after a clean run and once after up was killed: afterwards no netns,
// link, route, process or state file of it is left.
func TestUpDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	bin := buildVpcsim(t)
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			b := make([]byte, 2)
			rand.Read(b)
			c := commonFlags{prefix: "vy" + hex.EncodeToString(b), stateDir: t.TempDir()}
			t.Cleanup(func() { fabric.Cleanup(c.prefix) })
			upDown(t, bin, c, crash)
		})
	}
}

func upDown(t *testing.T, bin string, c commonFlags, crash bool) {
	flags := []string{"--prefix", c.prefix, "--state-dir", c.stateDir}
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append(args[:1:1], append(flags, args[1:]...)...)...).CombinedOutput()
		return string(out), err
	}

	var upOut bytes.Buffer
	up := exec.Command(bin, append([]string{"up", "--nodes", "2", "--outside", "--zones", "2", "--pod-subnets"}, flags...)...)
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	upDone := make(chan error, 1)
	go func() { upDone <- up.Wait() }()
	t.Cleanup(func() { up.Process.Kill() })
	s := waitState(t, statePath(c), upDone, &upOut)
	if len(s.Nodes) != 2 || s.PID != up.Process.Pid {
		t.Fatalf("state: %+v", s)
	}
	if s.Nodes[0].Zone != "us-west-2a" || s.Nodes[1].Zone != "us-west-2b" || len(s.PodSubnets) != 3 ||
		s.PodSubnets[1].CIDR != "100.65.16.0/20" || s.PodSubnets[1].Zone != "us-west-2b" || !strings.HasPrefix(s.PodSecurityGroup, "sg-") {
		t.Errorf("--zones 2 --pod-subnets: nodes %+v, pod subnets %+v, group %q", s.Nodes, s.PodSubnets, s.PodSecurityGroup)
	}
	if got := leftovers(t, c.prefix); len(got) != len(s.Nodes)+2 {
		t.Errorf("while up, host sees %v; want only the netns of router, outside host and nodes", got)
	}

	// The nodes reach each other and the outside host, and exec sets the SDK's environment.
	out, err := run("exec", "node1", "--", "ping", "-c", "1", "-W", "5", s.Nodes[1].PrimaryIP)
	if err != nil {
		t.Fatalf("ping node2 from node1: %v\n%s", err, out)
	}
	if out, err := run("exec", "node2", "--", "ping", "-c", "1", "-W", "5", s.OutsideAddr); err != nil {
		t.Fatalf("ping outside from node2: %v\n%s", err, out)
	}
	t.Setenv("AWS_REGION", "eu-north-1") // exec must override the caller's
	out, err = run("exec", "node2", "--", "sh", "-c", "echo $AWS_ENDPOINT_URL_EC2 $AWS_EC2_METADATA_SERVICE_ENDPOINT $AWS_REGION")
	if want := fabric.EC2URL + " " + fabric.IMDSURL + " us-west-2\n"; err != nil || out != want {
		t.Errorf("exec env: %q, %v; want %q", out, err, want)
	}
	// exec gives a hand-run daemon the node's own socket and checkpoint
	// (not the host's /run/vpcip), unless the caller chose them; down
	// removes them.
	dir := filepath.Join(c.stateDir, c.prefix, "node2")
	out, err = run("exec", "node2", "--", "sh", "-c", `echo $VPCIP_SOCKET $VPCIP_CHECKPOINT; mkdir -p "$(dirname "$VPCIP_CHECKPOINT")" && echo {} >"$VPCIP_CHECKPOINT"`)
	if want := filepath.Join(dir, "ipamd.sock") + " " + filepath.Join(dir, "ipam.json") + "\n"; err != nil || out != want {
		t.Errorf("exec daemon paths: %q, %v; want %q", out, err, want)
	}
	t.Setenv("VPCIP_CHECKPOINT", "/tmp/mine.json")
	if out, err := run("exec", "node2", "--", "sh", "-c", "echo $VPCIP_CHECKPOINT"); err != nil || out != "/tmp/mine.json\n" {
		t.Errorf("exec with the caller's VPCIP_CHECKPOINT: %q, %v", out, err)
	}
	t.Setenv("VPCIP_CHECKPOINT", "") // unset again: exec gives its own
	for _, f := range [][]string{
		{"fail-next", "AttachNetworkInterface", "AttachmentLimitExceeded"},
		{"latency", "*", "1ms", "1ms"},
		{"error-rate", "DescribeInstances", "0.5", "InternalError"},
		{"throttle", "describe", "100", "100"},
		{"imds-lag", "10ms"},
		{"reset"},
	} {
		if out, err := run(append([]string{"fault"}, f...)...); err != nil {
			t.Errorf("fault %v: %v\n%s", f, err, out)
		}
	}
	if out, err := run("fault", "error-rate", "*", "1.5", "X"); err == nil {
		t.Errorf("fault with rate 1.5 succeeded: %s", out)
	}
	if out, err := run("status"); err != nil || !strings.Contains(out, s.Nodes[0].InstanceID) {
		t.Errorf("status: %v\n%s", err, out)
	}

	// A process left running in a node, as a daemon would be.
	sleeper := exec.Command(bin, append(append([]string{"exec"}, flags...), "node1", "--", "sleep", "600")...)
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	sleeperDone := make(chan error, 1)
	go func() { sleeperDone <- sleeper.Wait() }()
	t.Cleanup(func() { sleeper.Process.Kill() })
	// Until it runs there (`ip netns exec` has entered the netns and
	// exec'd sleep, same pid): a down racing its start finds nothing to
	// stop, and under make test's load it did.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", sleeper.Process.Pid)); string(comm) == "sleep\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process exec'd in node1 did not start within 30 s")
		}
	}

	if crash {
		up.Process.Signal(syscall.SIGKILL)
		<-upDone
	}
	if out, err := run("down"); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	for name, done := range map[string]chan error{"vpcsim up": upDone, "process in node1": sleeperDone} {
		if crash && name == "vpcsim up" {
			continue
		}
		select {
		case err := <-done:
			if name == "vpcsim up" && err != nil {
				t.Errorf("vpcsim up exited with %v after down\n%s", err, upOut.String())
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s still runs after down", name)
		}
	}
	if left := leftovers(t, c.prefix); len(left) != 0 {
		t.Errorf("left after down: %v", left)
	}
	if _, err := os.Stat(statePath(c)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.stateDir, c.prefix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the nodes' daemon directories left: %v", err)
	}
	if out, err := run("down"); err != nil {
		t.Errorf("second down: %v\n%s", err, out)
	}
}

// waitState waits for `vpcsim up` to write its state file.
func waitState(t *testing.T, path string, upDone chan error, out *bytes.Buffer) *state {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if s, err := readState(path); err == nil {
			return s
		}
		select {
		case err := <-upDone:
			t.Fatalf("vpcsim up exited: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("no state file after 60 s\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
