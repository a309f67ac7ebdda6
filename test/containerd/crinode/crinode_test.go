package crinode

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMajor(t *testing.T) {
	tests := []struct {
		out  string
		want int
	}{
		{"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", 1},
		{"containerd github.com/containerd/containerd/v2 v2.4.2 5e2f1a0\n", 2},
	}
	for _, tt := range tests {
		got, err := parseMajor([]byte(tt.out))
		if err != nil || got != tt.want {
			t.Errorf("parseMajor(%q) = %d, %v; want %d", tt.out, got, err, tt.want)
		}
	}
	if _, err := parseMajor([]byte("containerd dev")); err == nil {
		t.Error("parseMajor accepted a version without a release")
	}
}

func TestMaxCNIVersion(t *testing.T) {
	if got := MaxCNIVersion(1); got != "1.0.0" {
		t.Errorf("containerd 1: %s, want 1.0.0", got)
	}
	if got := MaxCNIVersion(2); got != "1.1.0" {
		t.Errorf("containerd 2: %s, want 1.1.0", got)
	}
}

// TestWriteConfig checks the settings every node depends on are rendered, for
// both config schemas; that containerd accepts them is the scenarios' job.
func TestWriteConfig(t *testing.T) {
	p := configParams{Root: "/n/root", State: "/n/state", Socket: "/n/c.sock", RuncRoot: "/n/runc", OptDir: "/n/opt",
		CNIBinDir: "/n/cni/bin", CNIConfDir: "/n/cni/net.d", Runc: "/usr/sbin/runc", Pause: PauseImage}
	for _, tt := range []struct {
		version int
		want    []string
	}{
		{2, []string{`version = 2`, `address = "/n/c.sock"`, `restrict_oom_score_adj = true`, `sandbox_image = "localhost/vpcip/pause:1"`,
			`bin_dir = "/n/cni/bin"`, `conf_dir = "/n/cni/net.d"`, `Root = "/n/runc"`, `netns_mounts_under_state_dir = true`}},
		{3, []string{`version = 3`, `address = "/n/c.sock"`, `restrict_oom_score_adj = true`, `sandbox = "localhost/vpcip/pause:1"`,
			`bin_dirs = ["/n/cni/bin"]`, `conf_dir = "/n/cni/net.d"`, `Root = "/n/runc"`, `netns_mounts_under_state_dir = true`}},
	} {
		p.Version = tt.version
		var buf bytes.Buffer
		if err := writeConfig(&buf, p); err != nil {
			t.Fatal(err)
		}
		for _, w := range tt.want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("version %d config lacks %q:\n%s", tt.version, w, buf.String())
			}
		}
	}
	p.Version = 1
	if err := writeConfig(&bytes.Buffer{}, p); err == nil {
		t.Error("writeConfig accepted config version 1")
	}
}

// inspectOutput is `crictl inspectp -o json` of containerd 1.6, shortened.
const inspectOutput = `{
  "status": {"id": "e3ea03ee", "metadata": {"attempt": 1, "name": "p1", "namespace": "default", "uid": "u1"},
    "state": "SANDBOX_READY", "network": {"additionalIps": [{"ip": "fd00::2"}], "ip": "10.99.0.2"}},
  "info": {"pid": 14282, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"},
    {"path": "/var/run/netns/cni-3c5f8227", "type": "network"}]}}}
}`

func TestParseInspect(t *testing.T) {
	got, err := parseInspect([]byte(inspectOutput))
	if err != nil {
		t.Fatal(err)
	}
	want := Sandbox{
		ID: "e3ea03ee", State: "SANDBOX_READY", Pod: Pod{Name: "p1", Namespace: "default", UID: "u1", Attempt: 1},
		IP: netip.MustParseAddr("10.99.0.2"), AdditionalIPs: []netip.Addr{netip.MustParseAddr("fd00::2")},
		PID: 14282, NetnsPath: "/var/run/netns/cni-3c5f8227",
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("parseInspect (-want +got):\n%s", diff)
	}
	if _, err := parseInspect([]byte(`{"status": {"id": "x", "network": {"ip": "10.0.0.300"}}}`)); err == nil {
		t.Error("parseInspect accepted a malformed address")
	}
}

func TestParseStatus(t *testing.T) {
	out := `{"status": {"conditions": [{"type": "RuntimeReady", "status": true},
	  {"type": "NetworkReady", "status": false, "reason": "NetworkPluginNotReady", "message": "cni plugin not initialized"}]}}`
	got, err := parseStatus([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := Status{RuntimeReady: true, NetworkReason: "NetworkPluginNotReady", NetworkMessage: "cni plugin not initialized"}
	if got != want {
		t.Errorf("parseStatus = %+v, want %+v", got, want)
	}
}
