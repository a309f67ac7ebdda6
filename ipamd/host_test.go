package ipamd

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/test/netnsdir"
)

// NodeHost writes rp_filter through VPCIP_SYSCTL_NET_DIR (the chart's mount
// of the host's /proc/sys/net), not the container's read-only /proc/sys.
func TestNodeHostWritesSysctlsThroughItsDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("needs iptables")
	}
	name := fmt.Sprintf("vih-%d", os.Getpid())
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsdir.Delete(name) })
	h, err := ns.GetNS(netnsdir.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if out, err := exec.Command("ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "ipv4", "conf", "eth0", "rp_filter")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host := NodeHost{SysctlNet: dir}
	err = h.Do(func(ns.NetNS) error {
		return host.EnsureSNAT(hostnet.SNATConfig{VPCCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
			PrimaryIP: netip.MustParseAddr("10.0.0.10"), PrimaryLink: "eth0"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != "2" {
		t.Errorf("rp_filter in %s = %q, want 2", dir, b)
	}
}
