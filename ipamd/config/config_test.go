package config

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse(env(nil))
	if err != nil {
		t.Fatalf("Parse(empty) error: %v", err)
	}
	want := map[string]string{
		"WARM_ENI_TARGET":                    "unset",
		"WARM_IP_TARGET":                     "unset",
		"MINIMUM_IP_TARGET":                  "unset",
		"WARM_PREFIX_TARGET":                 "unset",
		"IP_COOLDOWN_PERIOD":                 "30s",
		"AWS_VPC_ENI_MTU":                    "9001",
		"VPCIP_SOCKET":                       "/run/vpcip/ipamd.sock",
		"VPCIP_CHECKPOINT":                   "/var/run/vpcip/ipam.json",
		"VPCIP_METRICS_ADDR":                 ":61678",
		"VPCIP_INTROSPECTION_ADDR":           "127.0.0.1:61679",
		"VPCIP_CNI_VERSION":                  "1.1.0",
		"VPCIP_HOSTNET":                      "true",
		"VPCIP_ADD_WAIT":                     "5s",
		"AWS_VPC_K8S_CNI_VETHPREFIX":         "eni",
		"AWS_VPC_K8S_CNI_RANDOMIZESNAT":      "prng",
		"VPCIP_CNI_CONF_DIR":                 "/etc/cni/net.d",
		"VPCIP_CNI_BIN_DIR":                  "/opt/cni/bin",
		"ENABLE_SUBNET_DISCOVERY":            "true",
		"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": "false",
		"ENI_CONFIG_ANNOTATION_DEF":          "k8s.amazonaws.com/eniConfig",
		"ENI_CONFIG_LABEL_DEF":               "k8s.amazonaws.com/eniConfig",
	}
	got := c.Map()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("default %s = %q, want %q", k, got[k], v)
		}
	}
	if c.LogLevel != slog.LevelInfo || c.RandomizeSNAT != "prng" || c.ExternalSNAT {
		t.Errorf("defaults: level %v randomizeSNAT %q externalSNAT %v", c.LogLevel, c.RandomizeSNAT, c.ExternalSNAT)
	}
}

func TestParseValues(t *testing.T) {
	c, err := Parse(env(map[string]string{
		"WARM_IP_TARGET":                     "5",
		"MINIMUM_IP_TARGET":                  "10",
		"WARM_ENI_TARGET":                    "0",
		"ENABLE_PREFIX_DELEGATION":           "true",
		"MAX_ENI":                            "-1",
		"IP_COOLDOWN_PERIOD":                 "45",
		"AWS_VPC_ENI_MTU":                    "1500",
		"AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": "10.1.0.0/16, 192.168.1.7/24",
		"AWS_VPC_K8S_CNI_RANDOMIZESNAT":      "none",
		"AWS_VPC_K8S_CNI_LOGLEVEL":           "debug",
		"VPCIP_HOSTNET":                      "false",
		"INTROSPECTION_BIND_ADDRESS":         "127.0.0.1:7000",
		"VPCIP_METRICS_ADDR":                 "off",
		"VPCIP_ADD_WAIT":                     "250ms",
		"VPCIP_CNI_VERSION":                  "1.0.0",
	}))
	if err != nil {
		t.Fatalf("Parse error: %v", err)
	}
	got := []any{c.WarmIPTarget, c.MinimumIPTarget, c.WarmENITarget, c.PrefixDelegation, c.MaxENI,
		c.Cooldown, c.MTU, c.ExcludeSNAT, c.RandomizeSNAT, c.LogLevel, c.HostNetwork,
		c.IntrospectionAddr, c.MetricsAddr, c.AddWait, c.CNIVersion}
	want := []any{5, 10, 0, true, 0,
		45 * time.Second, 1500, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("192.168.1.0/24")},
		"none", slog.LevelDebug, false,
		"127.0.0.1:7000", "", 250 * time.Millisecond, "1.0.0"}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("Parse (-want +got):\n%s", d)
	}
}

// TestParseErrorsNameEveryVariable: every bad value is reported at once, each
// with its variable name and the accepted form; none silently becomes a default.
func TestParseErrorsNameEveryVariable(t *testing.T) {
	bad := map[string]string{
		"WARM_IP_TARGET":                     "five",
		"MINIMUM_IP_TARGET":                  "-3",
		"ENABLE_PREFIX_DELEGATION":           "yes please",
		"MAX_ENI":                            "x",
		"IP_COOLDOWN_PERIOD":                 "soon",
		"AWS_VPC_ENI_MTU":                    "100000",
		"AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": "10.0.0.0/33",
		"AWS_VPC_K8S_CNI_RANDOMIZESNAT":      "maybe",
		"AWS_VPC_K8S_CNI_VETHPREFIX":         "toolong",
		"AWS_VPC_K8S_CNI_LOGLEVEL":           "loud",
		"VPCIP_SOCKET":                       "relative/path.sock",
		"VPCIP_METRICS_ADDR":                 "nope",
		"VPCIP_ADD_WAIT":                     "5",
		"VPCIP_CNI_VERSION":                  "9.9.9",
		"VPCIP_CLUSTER_NAME":                 "a b",
		"ENI_CONFIG_LABEL_DEF":               "Topology.Example/zone",
		"ENI_CONFIG_ANNOTATION_DEF":          "example.com/-bad-",
	}
	_, err := Parse(env(bad))
	if err == nil {
		t.Fatal("Parse accepted malformed values")
	}
	msg := err.Error()
	for name, v := range bad {
		line := ""
		for l := range strings.SplitSeq(msg, "\n") {
			if strings.HasPrefix(l, name+"=") {
				line = l
			}
		}
		if line == "" {
			t.Errorf("no error names %s=%q; errors:\n%s", name, v, msg)
			continue
		}
		if !strings.Contains(line, "want ") {
			t.Errorf("error for %s does not give the accepted form: %s", name, line)
		}
	}
}

func TestParseRejectsSocketEqualCheckpoint(t *testing.T) {
	_, err := Parse(env(map[string]string{"VPCIP_SOCKET": "/tmp/x", "VPCIP_CHECKPOINT": "/tmp/x"}))
	if err == nil || !strings.Contains(err.Error(), "VPCIP_SOCKET") {
		t.Fatalf("err = %v, want one naming VPCIP_SOCKET", err)
	}
}

// TestParseRejectsSecureMetricsWithoutMetrics: securing a listener that is
// off is a mistake, not a no-op.
func TestParseRejectsSecureMetricsWithoutMetrics(t *testing.T) {
	if _, err := Parse(env(map[string]string{"VPCIP_METRICS_SECURE": "true"})); err != nil {
		t.Errorf("VPCIP_METRICS_SECURE=true alone: %v", err)
	}
	_, err := Parse(env(map[string]string{"VPCIP_METRICS_SECURE": "true", "VPCIP_METRICS_ADDR": "off"}))
	if err == nil || !strings.Contains(err.Error(), "VPCIP_METRICS_SECURE=") {
		t.Errorf("VPCIP_METRICS_SECURE=true with VPCIP_METRICS_ADDR=off: err = %v, want one naming VPCIP_METRICS_SECURE", err)
	}
}

// FuzzParse: no value of any variable panics Parse, and an error always
// names the variable.
func FuzzParse(f *testing.F) {
	for _, v := range []string{"5", "-1", "[::1]:x", ",,10.0.0.0/8,", "30s", "off", "/a/b", "DEBUG"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		for _, name := range Names() {
			_, err := Parse(env(map[string]string{name: value}))
			if err != nil && !strings.Contains(err.Error(), name+"=") && !strings.Contains(err.Error(), "VPCIP_SOCKET=") {
				t.Fatalf("%s=%q: error %q does not name the variable", name, value, err)
			}
		}
	})
}

// TestUnsetWarmTargetsSelectAdaptive: with no warm variable set (in either
// mode) the pool runs the adaptive default; any one of them set, even to
// its AWS default, keeps the AWS semantics.
func TestUnsetWarmTargetsSelectAdaptive(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, true},
		{map[string]string{"ENABLE_PREFIX_DELEGATION": "true"}, true},
		{map[string]string{"WARM_ENI_TARGET": "1"}, false},
		{map[string]string{"WARM_IP_TARGET": "5"}, false},
		{map[string]string{"MINIMUM_IP_TARGET": "10"}, false},
		{map[string]string{"ENABLE_PREFIX_DELEGATION": "true", "WARM_PREFIX_TARGET": "1"}, false},
	} {
		c, err := Parse(func(k string) string { return tc.env[k] })
		if err != nil || c.AdaptivePool() != tc.want {
			t.Errorf("%v: adaptive %v, %v; want %v", tc.env, c.AdaptivePool(), err, tc.want)
		}
	}
}

// TestGCGraceBelowMinimumRefused: a CNI GC's list of valid attachments is
// made by the runtime before the plugin runs, so it can predate an ADD in
// flight; a VPCIP_GC_GRACE shorter than MinGCGrace would let that GC remove
// the new pod's veth and release its address. Such a value stops the daemon
// with an error naming the variable and the reason.
func TestGCGraceBelowMinimumRefused(t *testing.T) {
	for _, v := range []string{"0s", "0", "1ms", "3s", (MinGCGrace - time.Millisecond).String()} {
		_, err := Parse(env(map[string]string{"VPCIP_GC_GRACE": v}))
		if err == nil || !strings.Contains(err.Error(), "VPCIP_GC_GRACE=") || !strings.Contains(err.Error(), "at least "+MinGCGrace.String()) ||
			!strings.Contains(err.Error(), "valid attachments") {
			t.Errorf("VPCIP_GC_GRACE=%s: error %v, want a refusal naming the variable, the minimum and why", v, err)
		}
	}
	c, err := Parse(env(map[string]string{"VPCIP_GC_GRACE": MinGCGrace.String()}))
	if err != nil || c.GCGrace != MinGCGrace {
		t.Errorf("VPCIP_GC_GRACE=%s: %v, %v; want accepted", MinGCGrace, c.GCGrace, err)
	}
}

// TestAddressFamilyCombinations: IPv4 (the default) or IPv6 with prefix
// delegation and without IPv4, as the AWS VPC CNI requires; every other
// combination is refused naming the variables to change.
func TestAddressFamilyCombinations(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		v6, v4   bool
		refusing string // "" when valid; else the variable the error starts with
		mentions []string
	}{
		{"default is IPv4", nil, false, true, "", nil},
		{"IPv4 spelt out", map[string]string{"ENABLE_IPv4": "true", "ENABLE_IPv6": "false"}, false, true, "", nil},
		{"IPv6 mode", map[string]string{"ENABLE_IPv6": "true", "ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}, true, false, "", nil},
		{"dual stack", map[string]string{"ENABLE_IPv6": "true", "ENABLE_PREFIX_DELEGATION": "true"}, false, false, "ENABLE_IPv6=", []string{"ENABLE_IPv4", "dual stack"}},
		{"IPv6 without prefixes", map[string]string{"ENABLE_IPv6": "true", "ENABLE_IPv4": "false"}, false, false, "ENABLE_IPv6=", []string{"ENABLE_PREFIX_DELEGATION"}},
		{"no family", map[string]string{"ENABLE_IPv4": "false"}, false, false, "ENABLE_IPv4=", []string{"ENABLE_IPv6"}},
		{"no family, prefixes", map[string]string{"ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}, false, false, "ENABLE_IPv4=", []string{"ENABLE_IPv6"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(env(tt.env))
			if tt.refusing == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if c.IPv6 != tt.v6 || c.IPv4 != tt.v4 {
					t.Errorf("IPv6, IPv4 = %v, %v; want %v, %v", c.IPv6, c.IPv4, tt.v6, tt.v4)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.refusing) {
				t.Fatalf("err = %v, want one starting %q", err, tt.refusing)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("err %q does not mention %s", err, m)
				}
			}
		})
	}
}
