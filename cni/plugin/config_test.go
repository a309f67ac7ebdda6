package plugin

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"vpcip","type":"vpcip-cni","unknownKey":{"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := struct {
		Socket, Prefix, LogFile, Level string
		MTU                            int
		MTUSet                         bool
		Assign, Release, Status        time.Duration
	}{c.IPAMDSocket, c.VethPrefix, c.PluginLogFile, c.PluginLogLevel, c.MTU, c.MTUSet,
		time.Duration(c.Timeouts.Assign), time.Duration(c.Timeouts.Release), time.Duration(c.Timeouts.Status)}
	want := got
	want.Socket, want.Prefix, want.LogFile, want.Level = "/run/vpcip/ipamd.sock", "eni", "/var/log/vpcip/plugin.log", "info"
	want.MTU, want.MTUSet = 9001, false
	want.Assign, want.Release, want.Status = 30*time.Second, 10*time.Second, 2*time.Second
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

func TestParseConfigValues(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"vpcip-cni","ipamdSocket":"/tmp/x.sock",
		"mtu":1500,"vethPrefix":"cali","pluginLogLevel":"debug","timeouts":{"assign":"5s","gc":2.5},
		"runtimeConfig":{"portMappings":[]},"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.IPAMDSocket != "/tmp/x.sock" || c.MTU != 1500 || !c.MTUSet || c.VethPrefix != "cali" {
		t.Errorf("socket/mtu/prefix = %q/%d(%v)/%q", c.IPAMDSocket, c.MTU, c.MTUSet, c.VethPrefix)
	}
	if time.Duration(c.Timeouts.Assign) != 5*time.Second || time.Duration(c.Timeouts.GC) != 2500*time.Millisecond {
		t.Errorf("timeouts = %v, %v", time.Duration(c.Timeouts.Assign), time.Duration(c.Timeouts.GC))
	}
	want := []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}}
	if diff := cmp.Diff(want, c.ValidAttachments); diff != "" || !c.HasValidAttachments {
		t.Errorf("valid attachments (-want +got):\n%s", diff)
	}
	if _, ok := c.RuntimeConfig["portMappings"]; !ok {
		t.Errorf("runtimeConfig not passed through: %v", c.RuntimeConfig)
	}
}

// TestParseConfigErrors covers B36: every malformed config is a CNI error
// with the right code naming the field, never a panic.
func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, in string
		code     uint
		mention  string
	}{
		{"empty stdin", ``, types.ErrDecodingFailure, "not a JSON object"},
		{"truncated JSON", `{`, types.ErrDecodingFailure, "not a JSON object"},
		{"JSON array", `[1]`, types.ErrDecodingFailure, "not a JSON object"},
		{"JSON null", `null`, types.ErrDecodingFailure, "not a JSON object"},
		{"no cniVersion", `{"name":"n","type":"t"}`, types.ErrInvalidNetworkConfig, `"cniVersion"`},
		{"no name", `{"cniVersion":"1.0.0","type":"t"}`, types.ErrInvalidNetworkConfig, `"name"`},
		{"no type", `{"cniVersion":"1.0.0","name":"n"}`, types.ErrInvalidNetworkConfig, `"type"`},
		{"mtu string", `{"cniVersion":"1.0.0","name":"n","type":"t","mtu":"abc"}`, types.ErrInvalidNetworkConfig, `"mtu": wrong type`},
		{"mtu too small", `{"cniVersion":"1.0.0","name":"n","type":"t","mtu":100}`, types.ErrInvalidNetworkConfig, `"mtu"`},
		{"mtu too large", `{"cniVersion":"1.0.0","name":"n","type":"t","mtu":70000}`, types.ErrInvalidNetworkConfig, `"mtu"`},
		{"socket number", `{"cniVersion":"1.0.0","name":"n","type":"t","ipamdSocket":5}`, types.ErrInvalidNetworkConfig, `"ipamdSocket"`},
		{"prefix too long", `{"cniVersion":"1.0.0","name":"n","type":"t","vethPrefix":"abcdef"}`, types.ErrInvalidNetworkConfig, `"vethPrefix"`},
		{"prefix slash", `{"cniVersion":"1.0.0","name":"n","type":"t","vethPrefix":"a/b"}`, types.ErrInvalidNetworkConfig, `"vethPrefix"`},
		{"bad log level", `{"cniVersion":"1.0.0","name":"n","type":"t","pluginLogLevel":"loud"}`, types.ErrInvalidNetworkConfig, `"pluginLogLevel"`},
		{"bad timeout", `{"cniVersion":"1.0.0","name":"n","type":"t","timeouts":{"assign":"soon"}}`, types.ErrInvalidNetworkConfig, `"timeouts": assign`},
		{"timeout too long", `{"cniVersion":"1.0.0","name":"n","type":"t","timeouts":{"assign":1e300}}`, types.ErrInvalidNetworkConfig, `assign: 1e+300 seconds is too long`},
		{"timeout over an hour", `{"cniVersion":"1.0.0","name":"n","type":"t","timeouts":{"assign":9223372036}}`, types.ErrInvalidNetworkConfig, `assign: 2562047h47m16s is longer than 1h0m0s`},
		{"negative timeout", `{"cniVersion":"1.0.0","name":"n","type":"t","timeouts":{"gc":"-1s"}}`, types.ErrInvalidNetworkConfig, `gc: must not be negative`},
		{"timeouts not object", `{"cniVersion":"1.0.0","name":"n","type":"t","timeouts":3}`, types.ErrInvalidNetworkConfig, `"timeouts"`},
		{"attachments wrong", `{"cniVersion":"1.1.0","name":"n","type":"t","cni.dev/valid-attachments":{}}`, types.ErrInvalidNetworkConfig, `valid-attachments`},
		{"attachment without ifname", `{"cniVersion":"1.1.0","name":"n","type":"t","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"containerID":"z2"}]}`, types.ErrInvalidNetworkConfig, `entry 1 (containerID "z2") has no ifname`},
		{"attachment without containerID", `{"cniVersion":"1.1.0","name":"n","type":"t","cni.dev/attachments":[{"ifname":"eth0"}]}`, types.ErrInvalidNetworkConfig, `entry 0 has no containerID`},
		{"prevResult string", `{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":"x"}`, types.ErrInvalidNetworkConfig, `"prevResult"`},
		{"10 MB document", `{"cniVersion":"1.0.0","name":"n","type":"t","pad":"` + strings.Repeat("x", 10<<20) + `"}`, types.ErrDecodingFailure, "bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.in))
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("err = %v, want *types.Error", err)
			}
			if te.Code != tt.code || !strings.Contains(te.Msg, tt.mention) {
				t.Errorf("got code %d %q, want code %d mentioning %q", te.Code, te.Msg, tt.code, tt.mention)
			}
		})
	}
}

func TestPrevResult(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"cniVersion":"1.0.0",
		"interfaces":[{"name":"enia"},{"name":"eth0","sandbox":"/var/run/netns/x"}],
		"ips":[{"interface":1,"address":"100.64.1.7/32","gateway":"169.254.1.1"},{"interface":0,"address":"100.64.9.9/32"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := prevResultAddrs(c, "eth0", discardLogger())
	if len(got) != 1 || got[0].String() != "100.64.1.7" {
		t.Errorf("prevResult addresses for eth0 = %v, want [100.64.1.7]", got)
	}
	// B34: an empty or older-version prevResult is not fatal and yields nothing.
	for _, raw := range []string{`{}`, `{"cniVersion":"0.2.0","ip4":{"ip":"100.64.1.7/32"}}`} {
		c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":` + raw + `}`))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if got := prevResultAddrs(c, "eth0", discardLogger()); len(got) != 0 {
			t.Errorf("prevResult %s gave %v, want none", raw, got)
		}
	}
}

// The client's overall bound must not cut the longest call short: an ADD
// allowed 45 s must not end at a shorter default.
func TestTimeoutsLongest(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"n","type":"t","timeouts":{"assign":"45s","status":"1s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Timeouts.longest(); got != 45*time.Second {
		t.Errorf("longest = %v, want 45s", got)
	}
}
