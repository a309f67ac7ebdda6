package plugin

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name, in string
		want     PodArgs
		code     uint // 0: no error
	}{
		{"empty", "", PodArgs{}, 0},
		{"kubelet", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
			PodArgs{Namespace: "default", Name: "web-0", UID: "u-1", InfraContainerID: "abc"}, 0},
		{"unknown keys ignored", "FOO=bar;K8S_POD_NAME=p", PodArgs{Name: "p"}, 0},
		{"trailing separator", "K8S_POD_NAME=p;", PodArgs{Name: "p"}, 0},
		{"value with equals", "K8S_POD_NAME=a=b", PodArgs{Name: "a=b"}, 0},
		{"pair without equals", "K8S_POD_NAME=p;garbage", PodArgs{}, types.ErrInvalidEnvironmentVariables},
		{"empty key", "=v", PodArgs{}, types.ErrInvalidEnvironmentVariables},
		{"huge", strings.Repeat("A=1;", 20000), PodArgs{}, types.ErrInvalidEnvironmentVariables},
		{"pod name of 253 bytes", "K8S_POD_NAME=" + strings.Repeat("n", 253), PodArgs{Name: strings.Repeat("n", 253)}, 0},
		{"pod name over 253 bytes", "K8S_POD_NAME=" + strings.Repeat("n", 254), PodArgs{}, types.ErrInvalidEnvironmentVariables},
		{"pod UID over 253 bytes", "K8S_POD_UID=" + strings.Repeat("u", 60000), PodArgs{}, types.ErrInvalidEnvironmentVariables},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(tt.in)
			if tt.code != 0 {
				var te *types.Error
				if !errors.As(err, &te) || te.Code != tt.code {
					t.Fatalf("err = %v, want CNI code %d", err, tt.code)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseArgs(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

// FuzzParseConfig: any stdin gives a config or a *types.Error, never a
// panic, and an accepted config always satisfies the invariants the
// handlers rely on.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{``, `{`, `{"cniVersion":"1.1.0","name":"n","type":"t"}`,
		`{"cniVersion":"1.0.0","name":"n","type":"t","mtu":"abc"}`,
		`{"cniVersion":"1.0.0","name":"n","type":"t","timeouts":{"assign":1e308}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"ips":[{"address":"x"}]}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"t","cni.dev/valid-attachments":[{"containerID":1}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ParseConfig(in)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Msg == "" {
				t.Fatalf("error %v is not a CNI error with a message", err)
			}
			return
		}
		if c.Name == "" || c.Type == "" || c.CNIVersion == "" || c.IPAMDSocket == "" {
			t.Fatalf("accepted config lacks a required field: %+v", c)
		}
		if c.MTU < minMTU || c.MTU > maxMTU || c.VethPrefix == "" || len(c.VethPrefix) > maxVethPrefix {
			t.Fatalf("accepted config out of range: mtu %d prefix %q", c.MTU, c.VethPrefix)
		}
		if c.Timeouts.Assign <= 0 || c.Timeouts.Release <= 0 || c.Timeouts.Status <= 0 {
			t.Fatalf("accepted config with non-positive timeout: %+v", c.Timeouts)
		}
		_, _ = c.PrevResult() // must not panic
		_ = prevResultAddrs(c, "eth0", discardLogger())
	})
}

// FuzzParseArgs: any CNI_ARGS gives PodArgs or a code-4 error, never a panic.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{"", "K8S_POD_NAME=p", "a;b", "=;=", "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;IgnoreUnknown=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		a, err := ParseArgs(in)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables {
				t.Fatalf("error %v is not CNI code 4", err)
			}
			return
		}
		if a.Name != "" && !strings.Contains(in, "K8S_POD_NAME="+a.Name) {
			t.Fatalf("pod name %q not taken from %q", a.Name, in)
		}
	})
}
