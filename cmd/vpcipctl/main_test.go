package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/introspect/introspecttest"
)

func daemon(t *testing.T, s introspect.State) string {
	t.Helper()
	srv := httptest.NewServer(introspect.Handler(func() introspect.State { return s }))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func runCtl(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestTables(t *testing.T) {
	addr := daemon(t, introspecttest.Sample())
	tests := []struct {
		cmd  string
		want string
	}{
		{"capacity", `
NODE            USED  WARM  COOLING  CAPACITY  BUDGET  USED/BUDGET  ENIS  MAX ENIS
ip-100-64-0-10  3     9     1        18        27      11%          2     3
`},
		{"config", `
VARIABLE                      VALUE
AWS_VPC_ENI_MTU               9001
AWS_VPC_K8S_CNI_EXTERNALSNAT  false
IP_COOLDOWN_PERIOD            30
MINIMUM_IP_TARGET             -
WARM_ENI_TARGET               1
WARM_IP_TARGET                -
`},
		{"pool", `
ASSIGNED  WARM  COOLING  CAPACITY  BUDGET  ENIS  MAX ENIS
3         9     1        18        27      2     3
`},
		{"status", `
Node:        ip-100-64-0-10
Instance:    i-0a1b2c3d4e5f60718 (m5.large, us-west-2a)
Primary IP:  100.64.0.10
Mode:        secondary-ip
Ready:       yes
Addresses:   3 assigned, 9 warm, 1 cooling; capacity 18, budget 27
ENIs:        2 of 3
Kubernetes:  disabled
Started:     2026-11-29T10:58:00Z
`},
		{"enis", `
ENI                    DEVICE  TABLE  LINK  PRIMARY IP   SUBNET          ADDRESSES  ASSIGNED  COOLING  CAPACITY  PREFIXES
eni-0aaa1111bbbb2222c  0       254    eth0  100.64.0.10  100.64.0.0/20   9          2         1        9         -
eni-0ddd3333eeee4444f  1       2      eth1  100.64.16.5  100.64.16.0/20  4          1         0        9         -
`},
		{"pods", `
NAMESPACE    POD                       ADDRESS       ENI                    CONTAINER     IFNAME  ASSIGNED
default      web-7d4b9c6f5-x2x4q       100.64.0.20   eni-0aaa1111bbbb2222c  3f9a1c2b7d6e  eth0    2026-11-29T11:00:01Z
kube-system  coredns-5d78c9869d-k8s2m  100.64.0.21   eni-0aaa1111bbbb2222c  8c7b6a5f4e3d  eth0    2026-11-29T10:59:30Z
batch        worker-0                  100.64.16.10  eni-0ddd3333eeee4444f  d1e2f3a4b5c6  eth0    2026-11-29T11:02:45Z

COOLING      ENI                    UNASSIGNED
100.64.0.22  eni-0aaa1111bbbb2222c  2026-11-29T11:03:10Z
`},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			for _, args := range [][]string{
				{"--addr", addr, tt.cmd},
				{"--addr", addr, tt.cmd, "-o", "table"},
				{"-addr=" + addr, "-o", "table", tt.cmd},
			} {
				out, errOut, code := runCtl(t, args...)
				if code != 0 {
					t.Fatalf("%q: exit %d: %s", args, code, errOut)
				}
				if diff := cmp.Diff(strings.TrimPrefix(tt.want, "\n"), out); diff != "" {
					t.Fatalf("%q (-want +got):\n%s", args, diff)
				}
			}
		})
	}
}

func TestJSON(t *testing.T) {
	s := introspecttest.Sample()
	addr := daemon(t, s)

	out, errOut, code := runCtl(t, "--addr", addr, "capacity", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var c capacity
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("capacity -o json: %v\n%s", err, out)
	}
	want := capacity{Node: "ip-100-64-0-10"}
	want.Addresses.Used, want.Addresses.Warm, want.Addresses.Cooling, want.Addresses.Capacity, want.Addresses.Budget = 3, 9, 1, 18, 27
	want.ENIs.Used, want.ENIs.Max = 2, 3
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("capacity -o json (-want +got):\n%s", diff)
	}

	out, _, _ = runCtl(t, "--addr", addr, "-o", "json", "pool")
	var p api.Counts
	if err := json.Unmarshal([]byte(out), &p); err != nil || p != s.Pool {
		t.Errorf("pool -o json: %+v, %v; want %+v", p, err, s.Pool)
	}

	out, _, _ = runCtl(t, "--addr", addr, "config", "-o", "json")
	var cfg map[string]string
	if err := json.Unmarshal([]byte(out), &cfg); err != nil || !cmp.Equal(cfg, s.Config) {
		t.Errorf("config -o json: %v, %v; want %v", cfg, err, s.Config)
	}

	out, _, _ = runCtl(t, "--addr", addr, "pods", "-o", "json")
	var pods introspect.Pods
	if err := json.Unmarshal([]byte(out), &pods); err != nil || len(pods.Assignments) != 3 || len(pods.Cooling) != 1 ||
		pods.Assignments[2].Pod.Name != "worker-0" || pods.Assignments[2].Address.String() != "100.64.16.10" {
		t.Errorf("pods -o json: %+v, %v", pods, err)
	}
}

func TestNotReadyStatus(t *testing.T) {
	s := introspecttest.Sample()
	s.Ready, s.Reason = false, "waiting for cloud"
	out, _, code := runCtl(t, "--addr", daemon(t, s), "status")
	if code != 0 || !strings.Contains(out, "Ready:       no (waiting for cloud)\n") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}

func TestErrors(t *testing.T) {
	addr := daemon(t, introspecttest.Sample())
	closed := httptest.NewServer(nil)
	closed.Close()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"no command", []string{"--addr", addr}, exitUsage, "usage: vpcipctl"},
		{"unknown command", []string{"--addr", addr, "ips"}, exitUsage, `unknown command "ips"`},
		{"bad format", []string{"--addr", addr, "pool", "-o", "yaml"}, exitUsage, `-o "yaml": want table or json`},
		{"extra argument", []string{"--addr", addr, "pool", "now"}, exitUsage, "unexpected arguments"},
		{"bad flag", []string{"--bogus", "pool"}, exitUsage, "flag provided but not defined"},
		{"daemon down", []string{"--addr", strings.TrimPrefix(closed.URL, "http://"), "pool"}, exitFail, "is vpcipd running?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := runCtl(t, tt.args...)
			if code != tt.wantCode || !strings.Contains(errOut, tt.wantErr) || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and stderr with %q", code, out, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
}

// TestIPv6Tables: a node in IPv6 mode (one /80 on the primary ENI) shows
// its mode, the /80 and its pods' IPv6 addresses, and a capacity of 2^48-1
// used at 0%, in every table.
func TestIPv6Tables(t *testing.T) {
	s := introspecttest.Sample()
	pfx := netip.MustParsePrefix("2600:1f14:1:2:3::/80")
	s.Node.Mode = introspect.ModeIPv6Prefix
	s.ENIs = s.ENIs[:1]
	s.ENIs[0].Addresses, s.ENIs[0].Prefixes, s.ENIs[0].Capacity = []netip.Addr{}, []netip.Prefix{pfx}, 1<<48-1
	for i := range s.Assignments {
		s.Assignments[i].Address = netip.MustParseAddr(fmt.Sprintf("2600:1f14:1:2:3::%x", i+1))
		s.Assignments[i].ENIID = s.ENIs[0].ID
	}
	s.Cooling = nil
	s.Pool = api.Counts{Assigned: len(s.Assignments), Warm: 1<<48 - 1 - len(s.Assignments), Capacity: 1<<48 - 1, Budget: 1<<48 - 1, ENIs: 1, MaxENIs: 3}
	addr := daemon(t, s)
	for cmd, want := range map[string][]string{
		"status":   {"Mode:        ipv6-prefix", "3 assigned, 281474976710652 warm, 0 cooling; capacity 281474976710655"},
		"enis":     {"2600:1f14:1:2:3::/80", "281474976710655"},
		"pods":     {"2600:1f14:1:2:3::1 ", "2600:1f14:1:2:3::2 ", "2600:1f14:1:2:3::3 "},
		"capacity": {"281474976710655", " 0% "},
	} {
		out, errOut, code := runCtl(t, "--addr", addr, cmd)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", cmd, code, errOut)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", cmd, w, out)
			}
		}
	}
}
