package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestIPv6ModeRunDirectly: vpcipd run as a process takes the reference's
// IPv6 switches, refuses the combinations the reference refuses (exit 2,
// naming the variables) and a subnet without IPv6 (exit 1, naming it), and
// in IPv6 mode answers ADD with an address of the primary ENI's /80, the
// same one after a kill -9, without a second /80.
func TestIPv6ModeRunDirectly(t *testing.T) {
	bin := buildDaemon(t)
	v6 := []string{"ENABLE_IPv6=true", "ENABLE_IPv4=false", "ENABLE_PREFIX_DELEGATION=true"}

	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 7, Subnets: []vpcsim.SubnetSpec{
		{ID: "subnet-000000000000000c1", CIDR: netip.MustParsePrefix("100.64.0.0/24"), AvailabilityZone: "us-west-2a"},
		{ID: "subnet-000000000000000c2", CIDR: netip.MustParsePrefix("100.64.1.0/24"), AvailabilityZone: "us-west-2a", NoIPv6: true},
	}})

	for _, tt := range []struct {
		name string
		env  []string
		want []string
	}{
		{"dual stack", []string{"ENABLE_IPv6=true", "ENABLE_PREFIX_DELEGATION=true"}, []string{`ENABLE_IPv6="true": want false while ENABLE_IPv4=true`}},
		{"IPv6 without prefixes", []string{"ENABLE_IPv6=true", "ENABLE_IPv4=false"}, []string{`ENABLE_IPv6="true"`, "ENABLE_PREFIX_DELEGATION"}},
	} {
		dir := shortDir(t)
		cmd := exitingDaemon(t, bin)
		cmd.Env = append(daemonEnv(l, "i-none", dir), tt.env...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("%s: %v, want exit 2\n%s", tt.name, err, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: output lacks %q:\n%s", tt.name, w, out)
			}
		}
	}

	noV6, err := l.Cloud.LaunchInstance("m5.large", "subnet-000000000000000c2")
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	cmd := exitingDaemon(t, bin)
	cmd.Env = append(daemonEnv(l, noV6.ID, dir), v6...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "subnet-000000000000000c2") ||
		!strings.Contains(string(out), "no IPv6 CIDR block") {
		t.Fatalf("vpcipd in IPv6 mode on a subnet without IPv6: %v, want exit 1 naming the subnet\n%s", err, out)
	}

	inst := l.Launch(t, "m5.large")
	dir = shortDir(t)
	env := append(daemonEnv(l, inst.ID, dir), v6...)
	p := startDaemon(t, bin, env, dir)
	k := api.Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}
	a, err := p.client.Assign(context.Background(), api.AssignRequest{Key: k, Pod: api.Pod{Namespace: "default", Name: "p1"}})
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	var pfx []netip.Prefix
	for _, e := range l.Cloud.NetworkInterfaces() {
		if e.ID == inst.PrimaryENI.ID {
			pfx = e.IPv6Prefixes
		}
	}
	if len(pfx) != 1 || !pfx[0].Contains(a.Address) {
		t.Fatalf("ADD = %s; the primary ENI holds %v, want one /80 holding it", a.Address, pfx)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	p = startDaemon(t, bin, env, dir)
	again, err := p.client.Assign(context.Background(), api.AssignRequest{Key: k, Pod: api.Pod{Namespace: "default", Name: "p1"}})
	if err != nil || again.Address != a.Address {
		t.Errorf("ADD after kill -9 = %v, %v; want %s again", again.Address, err, a.Address)
	}
	if n := l.Cloud.Faults().Calls("AssignIpv6Addresses"); n != 1 {
		t.Errorf("AssignIpv6Addresses called %d times over two starts, want 1", n)
	}
}

// exitingDaemon is vpcipd run to stop by itself: killed after a minute
// (a daemon that keeps running fails the test instead of hanging it).
func exitingDaemon(t *testing.T, bin string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return exec.CommandContext(ctx, bin)
}

// TestInstallCNIIPv6: in IPv6 mode install-cni writes "enableV4Egress" from
// ENABLE_V4_EGRESS (default true) into the conflist and copies host-local
// from beside the plugin binary into the CNI bin dir; without a host-local
// beside it or in the bin dir it fails naming both, and with
// ENABLE_V4_EGRESS=false it needs none.
func TestInstallCNIIPv6(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 12})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	binDir, confDir, src := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(src, "vpcip-cni")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho plugin\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	env := append(daemonEnv(l, inst.ID, dir), "ENABLE_IPv6=true", "ENABLE_IPv4=false", "ENABLE_PREFIX_DELEGATION=true",
		"VPCIP_CNI_BIN_DIR="+binDir, "VPCIP_CNI_CONF_DIR="+confDir, "VPCIP_CNI_PLUGIN_SRC="+plugin, "VPCIP_INSTALL_WAIT=5s")
	startDaemon(t, bin, env, dir)
	install := func(extra ...string) (string, error) {
		cmd := exec.Command(bin, "install-cni")
		cmd.Env = append(slices.Clone(env), extra...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	egress := func() any {
		var doc struct {
			Plugins []map[string]any `json:"plugins"`
		}
		if err := json.Unmarshal([]byte(compactJSON(t, filepath.Join(confDir, "10-vpcip.conflist"))), &doc); err != nil || len(doc.Plugins) == 0 {
			t.Fatalf("conflist: %v %v", err, doc)
		}
		return doc.Plugins[0]["enableV4Egress"]
	}

	out, err := install()
	if err == nil || !strings.Contains(out, filepath.Join(src, "host-local")) || !strings.Contains(out, filepath.Join(binDir, "host-local")) {
		t.Fatalf("install-cni without host-local: %v, want a failure naming both paths\n%s", err, out)
	}
	if out, err := install("ENABLE_V4_EGRESS=false"); err != nil {
		t.Fatalf("install-cni with ENABLE_V4_EGRESS=false: %v\n%s", err, out)
	}
	if got := egress(); got != false {
		t.Errorf("ENABLE_V4_EGRESS=false: enableV4Egress = %v, want false", got)
	}
	if err := os.WriteFile(filepath.Join(src, "host-local"), []byte("#!/bin/sh\necho host-local\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := install(); err != nil {
		t.Fatalf("install-cni: %v\n%s", err, out)
	}
	if got := egress(); got != true {
		t.Errorf("enableV4Egress = %v, want true (the default)", got)
	}
	got, err := os.ReadFile(filepath.Join(binDir, "host-local"))
	if fi, _ := os.Stat(filepath.Join(binDir, "host-local")); err != nil || string(got) != "#!/bin/sh\necho host-local\n" || fi.Mode().Perm() != 0o755 {
		t.Errorf("installed host-local: %v %q", err, got)
	}
}
