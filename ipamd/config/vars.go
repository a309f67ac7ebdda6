package config

import (
	"log/slog"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vpcip/vpcip/logfile"
)

// Var is one environment variable the daemon reads: a row of Vars. Parse,
// Config.Map (the effective view), Names and the README's configuration
// table are all derived from or checked against Vars, so adding a setting is
// adding one row here (plus its Config field).
type Var struct {
	// Name is the variable, e.g. "WARM_IP_TARGET".
	Name string
	// Aliases are other names read when Name is unset, first set wins
	// (AWS VPC CNI spellings such as METRICS_BIND_ADDRESS).
	Aliases []string
	// Example is a valid value different from the default, written exactly
	// as the effective view shows it. The config test sets every variable to
	// its Example and expects both the parsed Config and Map to show it.
	Example string
	// ExampleNeeds are the other variables Example is valid only with
	// (ENABLE_IPv6=true needs ENABLE_IPv4=false and
	// ENABLE_PREFIX_DELEGATION=true); nil for most rows.
	ExampleNeeds map[string]string

	read func(p *parser, name string, c *Config) // parses the value of name into c
	show func(c *Config) string                  // the effective value, for Map
}

// setting builds a Var whose value is the Config field at returns: read
// parses it (getting the variable's name and the Config parsed so far, for
// defaults that depend on earlier rows), show formats it.
func setting[T any](name, example string, at func(*Config) *T, read func(p *parser, name string, c *Config) T, show func(T) string) Var {
	return Var{
		Name:    name,
		Example: example,
		read:    func(p *parser, n string, c *Config) { *at(c) = read(p, n, c) },
		show:    func(c *Config) string { return show(*at(c)) },
	}
}

// withAliases returns v reading aliases when v.Name is unset.
func withAliases(v Var, aliases ...string) Var {
	v.Aliases = aliases
	return v
}

// withNeeds returns v whose Example is valid only with the variables of needs set.
func withNeeds(v Var, needs map[string]string) Var {
	v.ExampleNeeds = needs
	return v
}

// Vars lists every variable, in parse order (a row's reader may use rows
// above it, as VPCIP_PLUGIN_LOG_LEVEL's default is the daemon's
// level).
var Vars = []Var{
	// Warm pool.
	setting("WARM_ENI_TARGET", "3", func(c *Config) *int { return &c.WarmENITarget }, count(0), showTarget),
	setting("WARM_IP_TARGET", "5", func(c *Config) *int { return &c.WarmIPTarget }, count(0), showTarget),
	setting("MINIMUM_IP_TARGET", "11", func(c *Config) *int { return &c.MinimumIPTarget }, count(0), showTarget),
	setting("ENABLE_PREFIX_DELEGATION", "true", func(c *Config) *bool { return &c.PrefixDelegation }, boolean(false), strconv.FormatBool),
	withNeeds(setting("ENABLE_IPv6", "true", func(c *Config) *bool { return &c.IPv6 }, boolean(false), strconv.FormatBool),
		map[string]string{"ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}),
	withNeeds(setting("ENABLE_IPv4", "false", func(c *Config) *bool { return &c.IPv4 }, boolean(true), strconv.FormatBool),
		map[string]string{"ENABLE_IPv6": "true", "ENABLE_PREFIX_DELEGATION": "true"}),
	setting("ENABLE_V4_EGRESS", "false", func(c *Config) *bool { return &c.V4Egress }, boolean(true), strconv.FormatBool),
	setting("WARM_PREFIX_TARGET", "4", func(c *Config) *int { return &c.WarmPrefixTarget }, count(0), showTarget),
	setting("MAX_ENI", "2", func(c *Config) *int { return &c.MaxENI }, readMaxENI, strconv.Itoa),
	setting("VPCIP_MAX_PODS", "29", func(c *Config) *int { return &c.MaxPods }, count(0), strconv.Itoa),
	setting("IP_COOLDOWN_PERIOD", "45s", func(c *Config) *time.Duration { return &c.Cooldown }, seconds(30*time.Second), time.Duration.String),
	setting("VPCIP_RELEASE_INTERVAL", "31s", func(c *Config) *time.Duration { return &c.ReleaseInterval }, duration(30*time.Second, 0), time.Duration.String),
	setting("VPCIP_ENI_MIN_AGE", "2m0s", func(c *Config) *time.Duration { return &c.ENIMinAge }, duration(time.Minute, 0), time.Duration.String),

	// Datapath.
	setting("AWS_VPC_ENI_MTU", "1500", func(c *Config) *int { return &c.MTU }, intRange(DefaultMTU, 576, 9001), strconv.Itoa),
	setting("AWS_VPC_K8S_CNI_EXTERNALSNAT", "true", func(c *Config) *bool { return &c.ExternalSNAT }, boolean(false), strconv.FormatBool),
	setting("AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS", "10.1.0.0/16,192.168.0.0/24", func(c *Config) *[]netip.Prefix { return &c.ExcludeSNAT }, readCIDRs, showCIDRs),
	setting("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "hashrandom", func(c *Config) *string { return &c.RandomizeSNAT }, readRandomizeSNAT, plain),
	setting("AWS_VPC_K8S_CNI_VETHPREFIX", "pod", func(c *Config) *string { return &c.VethPrefix }, vethPrefix("eni"), plain),
	setting("VPCIP_SYSCTL_NET_DIR", "/host/proc/sys/net", func(c *Config) *string { return &c.SysctlNet }, path("/proc/sys/net"), plain),
	setting("VPCIP_HOSTNET", "false", func(c *Config) *bool { return &c.HostNetwork }, boolean(true), strconv.FormatBool),
	setting("VPCIP_IMDS_POD_ACCESS", IMDSAll, func(c *Config) *string { return &c.IMDSPodAccess }, oneOf(IMDSBlocked, []string{IMDSBlocked, IMDSAll}), plain),
	setting("VPCIP_IMDS_ALLOW_NAMESPACES", "kube-system,monitoring", func(c *Config) *[]string { return &c.IMDSAllowNamespaces }, readNamespaces, showList),
	setting("AWS_VPC_K8S_CNI_LOGLEVEL", "DEBUG", func(c *Config) *slog.Level { return &c.LogLevel }, logLevel(slog.LevelInfo), levelName),
	setting("AWS_VPC_K8S_CNI_LOG_FILE", "/var/log/vpcip/ipamd.log", func(c *Config) *string { return &c.LogFile }, logFile("", false), plain),

	// Where new ENIs go.
	setting("ENABLE_SUBNET_DISCOVERY", "false", func(c *Config) *bool { return &c.SubnetDiscovery }, boolean(true), strconv.FormatBool),
	setting("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true", func(c *Config) *bool { return &c.CustomNetworking }, boolean(false), strconv.FormatBool),
	setting("ENI_CONFIG_ANNOTATION_DEF", "example.com/eni-config", func(c *Config) *string { return &c.ENIConfigAnnotation }, labelKey(DefaultENIConfigKey), plain),
	setting("ENI_CONFIG_LABEL_DEF", "topology.kubernetes.io/zone", func(c *Config) *string { return &c.ENIConfigLabel }, labelKey(DefaultENIConfigKey), plain),

	// Daemon plumbing.
	withAliases(setting("VPCIP_CLUSTER_NAME", "blue-cluster", func(c *Config) *string { return &c.ClusterName }, name("vpcip"), plain), "CLUSTER_NAME"),
	setting("MY_NODE_NAME", "node-7", func(c *Config) *string { return &c.NodeName }, name(""), plain),
	withAliases(setting("VPCIP_KUBECONFIG", "/etc/x/kubeconfig", func(c *Config) *string { return &c.Kubeconfig }, path(""), plain), "KUBECONFIG"),
	setting("VPCIP_POD_LEAK_GRACE", "3m0s", func(c *Config) *time.Duration { return &c.PodLeakGrace }, duration(2*time.Minute, time.Second), time.Duration.String),
	setting("VPCIP_BUDGET_INTERVAL", "30s", func(c *Config) *time.Duration { return &c.BudgetInterval }, duration(15*time.Second, time.Second), time.Duration.String),
	setting("VPCIP_COUNTS_INTERVAL", "2m0s", func(c *Config) *time.Duration { return &c.CountsInterval }, duration(time.Minute, time.Second), time.Duration.String),
	setting("VPCIP_EC2_BUDGET", "fleet", func(c *Config) *string { return &c.EC2Budget }, oneOf(EC2BudgetNode, []string{EC2BudgetNode, EC2BudgetFleet}), plain),
	setting("VPCIP_EC2_BUDGET_SHARE", "95", func(c *Config) *int { return &c.EC2BudgetShare }, intRange(80, 1, 100), strconv.Itoa),
	setting("VPCIP_EC2_BUDGET_SHARDS", "16", func(c *Config) *int { return &c.EC2BudgetShards }, intRange(8, 1, 256), strconv.Itoa),
	setting("VPCIP_NAMESPACE", "vpcip-system", func(c *Config) *string { return &c.Namespace }, name("kube-system"), plain),
	setting("VPCIP_SOCKET", "/run/x/ipamd.sock", func(c *Config) *string { return &c.Socket }, path(DefaultSocket), plain),
	setting("VPCIP_CHECKPOINT", "/run/x/ipam.json", func(c *Config) *string { return &c.Checkpoint }, path(DefaultCheckpoint), plain),
	withAliases(setting("VPCIP_METRICS_ADDR", "127.0.0.1:9101", func(c *Config) *string { return &c.MetricsAddr }, addr(DefaultMetricsAddr), plain), "METRICS_BIND_ADDRESS"),
	withAliases(setting("VPCIP_INTROSPECTION_ADDR", "127.0.0.1:9102", func(c *Config) *string { return &c.IntrospectionAddr }, addr(DefaultIntrospectionAddr), plain), "INTROSPECTION_BIND_ADDRESS"),
	setting("VPCIP_METRICS_SECURE", "true", func(c *Config) *bool { return &c.MetricsSecure }, boolean(false), strconv.FormatBool),
	setting("VPCIP_METRICS_TLS_DIR", "/etc/x/metrics-tls", func(c *Config) *string { return &c.MetricsTLSDir }, path(""), plain),
	setting("VPCIP_METRICS_AWSCNI_NAMES", "true", func(c *Config) *bool { return &c.AWSCNIMetricNames }, boolean(false), strconv.FormatBool),
	setting("VPCIP_SUBNET_METRICS_INTERVAL", "10m0s", func(c *Config) *time.Duration { return &c.SubnetMetricsInterval }, duration(30*time.Minute, time.Second), time.Duration.String),
	setting("VPCIP_ADD_WAIT", "250ms", func(c *Config) *time.Duration { return &c.AddWait }, duration(5*time.Second, 0), time.Duration.String),
	setting("VPCIP_POOL_INTERVAL", "11s", func(c *Config) *time.Duration { return &c.PoolInterval }, duration(10*time.Second, 10*time.Millisecond), time.Duration.String),
	setting("VPCIP_RECONCILE_INTERVAL", "1m1s", func(c *Config) *time.Duration { return &c.ReconcileInterval }, duration(time.Minute, 10*time.Millisecond), time.Duration.String),
	setting("VPCIP_RESYNC_INTERVAL", "6m0s", func(c *Config) *time.Duration { return &c.ResyncInterval }, duration(5*time.Minute, 10*time.Millisecond), time.Duration.String),
	setting("VPCIP_LEAK_SWEEP_INTERVAL", "7m0s", func(c *Config) *time.Duration { return &c.LeakSweepInterval }, duration(5*time.Minute, 10*time.Millisecond), time.Duration.String),
	setting("VPCIP_LEAKED_ENI_GRACE", "8m0s", func(c *Config) *time.Duration { return &c.LeakedENIGrace }, duration(5*time.Minute, 0), time.Duration.String),
	setting("VPCIP_GC_GRACE", "1m2s", func(c *Config) *time.Duration { return &c.GCGrace }, gcGrace, time.Duration.String),

	// install-cni.
	setting("VPCIP_CNI_BIN_DIR", "/opt/x/bin", func(c *Config) *string { return &c.CNIBinDir }, path(DefaultCNIBinDir), plain),
	setting("VPCIP_CNI_CONF_DIR", "/etc/x/net.d", func(c *Config) *string { return &c.CNIConfDir }, path(DefaultCNIConfDir), plain),
	setting("VPCIP_CNI_VERSION", "1.0.0", func(c *Config) *string { return &c.CNIVersion }, oneOf(DefaultCNIVersion, SupportedCNIVersions), plain),
	setting("VPCIP_CNI_PLUGIN_SRC", "/opt/x/vpcip-cni", func(c *Config) *string { return &c.PluginSource }, path(""), plain),
	withAliases(setting("VPCIP_PLUGIN_LOG_FILE", "/var/log/x/plugin.log", func(c *Config) *string { return &c.PluginLogFile }, logFile(DefaultPluginLogFile, true), plain), "AWS_VPC_K8S_PLUGIN_LOG_FILE"),
	withAliases(setting("VPCIP_PLUGIN_LOG_LEVEL", "WARN", func(c *Config) *string { return &c.PluginLogLevel }, readPluginLogLevel, plain), "AWS_VPC_K8S_PLUGIN_LOG_LEVEL"),
	setting("VPCIP_INSTALL_WAIT", "3m0s", func(c *Config) *time.Duration { return &c.InstallWait }, duration(10*time.Minute, 0), time.Duration.String),
}

// SDKNames are variables the AWS SDK reads itself; vpcipd documents them
// (README, usage) but does not parse them.
var SDKNames = []string{"AWS_REGION", "AWS_ENDPOINT_URL_EC2", "AWS_EC2_METADATA_SERVICE_ENDPOINT"}

// Readers used by the rows above; each reports a bad value through p.fail.

func count(def int) func(*parser, string, *Config) int {
	return func(p *parser, n string, _ *Config) int { return p.count(n, def) }
}

func intRange(def, lo, hi int) func(*parser, string, *Config) int {
	return func(p *parser, n string, _ *Config) int { return p.intRange(n, def, lo, hi) }
}

func boolean(def bool) func(*parser, string, *Config) bool {
	return func(p *parser, n string, _ *Config) bool { return p.boolean(n, def) }
}

func seconds(def time.Duration) func(*parser, string, *Config) time.Duration {
	return func(p *parser, n string, _ *Config) time.Duration { return p.seconds(n, def) }
}

func duration(def, min time.Duration) func(*parser, string, *Config) time.Duration {
	return func(p *parser, n string, _ *Config) time.Duration { return p.duration(n, def, min) }
}

// gcGrace reads VPCIP_GC_GRACE: at least MinGCGrace (see there).
func gcGrace(p *parser, n string, _ *Config) time.Duration {
	return p.durationWhy(n, time.Minute, MinGCGrace,
		"a CNI GC's list of valid attachments can predate an ADD in flight, and a shorter grace lets that GC remove the new pod's veth and release its address")
}

func vethPrefix(def string) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string { return p.vethPrefix(n, def) }
}

func logLevel(def slog.Level) func(*parser, string, *Config) slog.Level {
	return func(p *parser, n string, _ *Config) slog.Level { return p.logLevel(n, def) }
}

func name(def string) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string { return p.name(n, def) }
}

// path is an absolute path; def "" means optional (unset stays "").
func path(def string) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string {
		if def == "" {
			return p.optionalPath(n)
		}
		return p.path(n, def)
	}
}

// logFile is a log-file setting (package logfile): an absolute path, or a
// stream name: "stdout" and "stderr" for the daemon, only "stderr" for the
// plugin (its stdout carries the CNI result). An empty value is the default.
func logFile(def string, plugin bool) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string {
		v, ok := p.get(n)
		if !ok || v == "" {
			return def
		}
		if err := logfile.Check(v); err != nil || (plugin && v == logfile.Stdout) {
			if plugin {
				p.fail(n, v, "an absolute path or stderr")
			} else {
				p.fail(n, v, "an absolute path, stdout or stderr")
			}
			return def
		}
		if v == logfile.Stdout || v == logfile.Stderr {
			return v
		}
		return filepath.Clean(v)
	}
}

func labelKey(def string) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string { return p.labelKey(n, def) }
}

func addr(def string) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string { return p.addr(n, def) }
}

func oneOf(def string, allowed []string) func(*parser, string, *Config) string {
	return func(p *parser, n string, _ *Config) string { return p.oneOf(n, def, allowed) }
}

// showTarget shows a warm target, "unset" for 0: with all four unset the
// pool runs vpcip's adaptive default (Config.AdaptivePool).
func showTarget(n int) string {
	if n == 0 {
		return "unset"
	}
	return strconv.Itoa(n)
}

func readMaxENI(p *parser, n string, _ *Config) int { return p.maxENI(n) }

func readCIDRs(p *parser, n string, _ *Config) []netip.Prefix { return p.cidrs(n) }

func readRandomizeSNAT(p *parser, n string, _ *Config) string { return p.randomizeSNAT(n) }

// readPluginLogLevel defaults to the daemon's level and reads the names the
// daemon's level takes (any case; the AWS VPC CNI's FATAL is ERROR), shown
// as DEBUG, INFO, WARN or ERROR.
func readPluginLogLevel(p *parser, n string, c *Config) string {
	return levelName(p.logLevel(n, c.LogLevel))
}

func plain(s string) string { return s }

func readNamespaces(p *parser, n string, _ *Config) []string { return p.namespaces(n) }

func showList(s []string) string { return strings.Join(s, ",") }

func showCIDRs(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
