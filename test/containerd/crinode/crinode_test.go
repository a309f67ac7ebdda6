package crinode

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
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
		CNIBinDir: "/n/cni/bin", CNIConfDir: "/n/cni/net.d", Runc: "/usr/sbin/runc", Pause: "localhost/vpcip/pause:1"}
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

// verboseInfo is the "info" entry of containerd 1.6's verbose
// PodSandboxStatus, shortened.
const verboseInfo = `{"pid": 14282, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"},
  {"path": "/var/run/netns/cni-3c5f8227", "type": "network"}]}}}`

func TestSandboxFrom(t *testing.T) {
	resp := &cri.PodSandboxStatusResponse{
		Status: &cri.PodSandboxStatus{
			Id:       "e3ea03ee",
			Metadata: &cri.PodSandboxMetadata{Name: "p1", Namespace: "default", Uid: "u1", Attempt: 1},
			State:    cri.PodSandboxState_SANDBOX_READY,
			Network:  &cri.PodSandboxNetworkStatus{Ip: "10.99.0.2", AdditionalIps: []*cri.PodIP{{Ip: "fd00::2"}}},
		},
		Info: map[string]string{"info": verboseInfo},
	}
	got, err := sandboxFrom(resp)
	if err != nil {
		t.Fatal(err)
	}
	want := Sandbox{
		ID: "e3ea03ee", State: "SANDBOX_READY", Pod: Pod{Name: "p1", Namespace: "default", UID: "u1", Attempt: 1},
		IP: netip.MustParseAddr("10.99.0.2"), AdditionalIPs: []netip.Addr{netip.MustParseAddr("fd00::2")},
		PID: 14282, NetnsPath: "/var/run/netns/cni-3c5f8227",
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("sandboxFrom (-want +got):\n%s", diff)
	}

	resp.Status.Network.Ip = "10.0.0.300"
	if _, err := sandboxFrom(resp); err == nil {
		t.Error("sandboxFrom accepted a malformed address")
	}
	resp.Status.Network.Ip = ""
	resp.Info["info"] = "{"
	if _, err := sandboxFrom(resp); err == nil {
		t.Error("sandboxFrom accepted malformed verbose info")
	}
}

func TestImageName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "image.tar")
	var buf bytes.Buffer
	_, err := ociarchive.Write(&buf, ociarchive.Image{Name: "localhost/test/pause:9", OS: "linux", Architecture: "amd64",
		Files: []ociarchive.File{{Path: "/pause", Mode: 0o755, Data: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := imageName(path)
	if err != nil || got != "localhost/test/pause:9" {
		t.Errorf("imageName = %q, %v; want localhost/test/pause:9", got, err)
	}
	if err := os.WriteFile(path, []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := imageName(path); err == nil {
		t.Error("imageName accepted a file that is no archive")
	}
}
