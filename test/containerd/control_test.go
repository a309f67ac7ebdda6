package containerd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netns"

	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// bridgeNetwork is the reference conflist: the bridge plugin with host-local
// IPAM, a subnet per node. It is the control: the same scenarios pass with it
// when the runtime setup is sound.
type bridgeNetwork struct {
	name    string       // CNI network name, also host-local's store directory
	bridge  string       // bridge link in the node netns
	subnet  netip.Prefix // host-local range
	dataDir string       // host-local store
}

func newBridgeNetwork(n *crinode.Node, subnet netip.Prefix) *bridgeNetwork {
	return &bridgeNetwork{name: "control", bridge: "vcrbr0", subnet: subnet, dataDir: filepath.Join(n.Dir, "host-local")}
}

// conflist renders the reference conflist for a CNI version.
func (b *bridgeNetwork) conflist(cniVersion string) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": cniVersion,
		"name":       b.name,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": b.bridge, "isGateway": true, "ipMasq": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": b.subnet.String()}}},
				"dataDir": b.dataDir,
			},
		}},
	}, "", "  ")
}

func (b *bridgeNetwork) Install(t testing.TB, n *crinode.Node) {
	t.Helper()
	data, err := b.conflist(crinode.MaxCNIVersion(n.Major))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.CNIConfDir, "10-control.conflist"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (b *bridgeNetwork) CheckAttached(t *testing.T, n *crinode.Node, sb crinode.Sandbox) {
	t.Helper()
	if !b.subnet.Contains(sb.IP) {
		t.Errorf("%s: CRI reports %s, outside the host-local range %s", sb.Pod.Name, sb.IP, b.subnet)
	}
	if got := linkAddrs(t, podNetnsPath(sb), "eth0"); !slices.Contains(got, sb.IP) {
		t.Errorf("%s: eth0 in the sandbox has %v, CRI reports %s", sb.Pod.Name, got, sb.IP)
	}
	record, err := os.ReadFile(filepath.Join(b.dataDir, b.name, sb.IP.String()))
	if err != nil {
		t.Errorf("%s: host-local holds no reservation for %s: %v", sb.Pod.Name, sb.IP, err)
	} else if !strings.Contains(string(record), sb.ID) {
		t.Errorf("%s: host-local reserved %s for %q, not for sandbox %s", sb.Pod.Name, sb.IP, record, sb.ID)
	}
}

func (b *bridgeNetwork) CheckReleased(t *testing.T, n *crinode.Node, gone []crinode.Sandbox) {
	t.Helper()
	reserved := hostLocalReserved(t, b.dataDir, b.name)
	for _, sb := range gone {
		if slices.Contains(reserved, sb.IP) {
			t.Errorf("%s: host-local still holds %s", sb.Pod.Name, sb.IP)
		}
	}
	if ports := bridgePorts(t, n.Netns, b.bridge); len(ports) != len(reserved) {
		t.Errorf("bridge %s has ports %v for %d reserved addresses", b.bridge, ports, len(reserved))
	}
}

// bridgePorts lists the links enslaved to the bridge in the named netns.
func bridgePorts(t testing.TB, netnsName, bridge string) []string {
	t.Helper()
	h, err := netns.GetFromName(netnsName)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlinksafe.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	br, err := nl.LinkByName(bridge)
	if err != nil {
		t.Fatalf("bridge %s in %s: %v", bridge, netnsName, err)
	}
	links, err := nl.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var ports []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports = append(ports, l.Attrs().Name)
		}
	}
	return ports
}

// TestControlBridge runs the node scenarios with the reference bridge +
// host-local conflist in a throwaway netns.
func TestControlBridge(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, tools crinode.Tools) {
		n := startNode(t, tools, newNetns(t), "bridge", "host-local")
		runLifecycle(t, n, newBridgeNetwork(n, netip.MustParsePrefix("100.127.0.0/24")))
	})
}

var _ podNetwork = (*bridgeNetwork)(nil)

// TestCloseAfterCrash checks the harness's own cleanup: after containerd is
// killed with sandboxes running, their shims and mounts are still there, and
// Node.Close leaves no shim process and no mount under the node's directory.
func TestCloseAfterCrash(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, tools crinode.Tools) {
		n := startNode(t, tools, newNetns(t), "bridge", "host-local")
		pn := newBridgeNetwork(n, netip.MustParsePrefix("100.127.2.0/24"))
		pn.Install(t, n)
		if _, err := n.WaitNetworkReady(context.Background(), 15*time.Second); err != nil {
			t.Fatal(err)
		}
		sbs := runSandboxes(t, n, "crash", 3)
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
		shims, err := n.Shims()
		if err != nil || len(shims) == 0 {
			t.Fatalf("after the crash: shims %v, %v; want the sandboxes' shims still running", shims, err)
		}
		if mounts, err := n.Mounts(); err != nil || !slices.Contains(mounts, sbs[0].NetnsPath) {
			t.Fatalf("after the crash: mounts %v, %v; want %s among them", mounts, err, sbs[0].NetnsPath)
		}
		var pauses []int
		for _, sb := range sbs {
			pauses = append(pauses, netnsProcesses(t, sb.NetnsPath)...)
		}
		if len(pauses) < len(sbs) {
			t.Fatalf("after the crash: %d processes in the %d sandbox netns, want each sandbox's pause", len(pauses), len(sbs))
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			shims, err = n.Shims()
			if err == nil && len(shims) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(shims) != 0 || err != nil {
			t.Errorf("after Close: shims %v still running (%v)", shims, err)
		}
		if mounts, err := n.Mounts(); len(mounts) != 0 || err != nil {
			t.Errorf("after Close: mounts left under %s: %v (%v)", n.Dir, mounts, err)
		}
		// runc delete --force kills them; the kernel finishes within moments.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			pauses = slices.DeleteFunc(pauses, func(pid int) bool {
				_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
				return err != nil
			})
			if len(pauses) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(pauses) > 0 {
			t.Errorf("after Close: sandbox processes %v still run", pauses)
		}
	})
}

// netnsProcesses lists the processes whose network namespace is the one
// bound at path.
func netnsProcesses(t *testing.T, path string) []int {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && link == want {
			pids = append(pids, pid)
		}
	}
	return pids
}
