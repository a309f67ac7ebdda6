// Package config is vpcipd's configuration: one typed Config parsed once from
// the environment. Names follow the AWS VPC CNI where one exists (WARM_IP_TARGET,
// IP_COOLDOWN_PERIOD, AWS_VPC_ENI_MTU, ...) so existing values keep working;
// vpcip's own settings start with VPCIP_.
//
// Parse takes a getenv function so tests and other callers never touch the
// process environment; only cmd/vpcipd passes os.Getenv. Every malformed value
// is reported, joined with errors.Join, each naming the variable and the form
// it accepts.
//
// Every variable is one row of Vars (vars.go): its name, aliases, an example
// value, how it is parsed into Config and how the effective view shows it.
// Parse, Config.Map, Names and the README's configuration table all follow
// Vars, and tests fail when a Config field, the view or the README misses a
// row. Adding a setting: a Config field and one row.
package config

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"
)

// Config is the daemon's effective configuration.
type Config struct {
	// Warm pool (AWS VPC CNI meaning; 0 is unset unless noted).
	WarmENITarget    int  // WARM_ENI_TARGET, whole ENIs of free addresses
	WarmIPTarget     int  // WARM_IP_TARGET, free addresses
	MinimumIPTarget  int  // MINIMUM_IP_TARGET, floor on addresses held by the node
	WarmPrefixTarget int  // WARM_PREFIX_TARGET, free /28 prefixes (prefix mode)
	PrefixDelegation bool // ENABLE_PREFIX_DELEGATION: assign /28 prefixes instead of /32s
	MaxENI           int  // MAX_ENI: cap on ENIs below the instance type's limit; 0 (or -1) = no cap
	MaxPods          int  // VPCIP_MAX_PODS: pods the node may run; 0 = limited by ENIs only
	// IPv6 is ENABLE_IPv6 (default false): pods get IPv6 addresses from one
	// /80 prefix on the primary ENI, assigned once and kept (no warm pool).
	// The reference's rule holds: only with ENABLE_PREFIX_DELEGATION=true
	// and ENABLE_IPv4=false (Parse refuses any other combination).
	IPv6 bool
	// IPv4 is ENABLE_IPv4 (default true): pods get IPv4 addresses. false
	// only together with ENABLE_IPv6=true.
	IPv4 bool
	// V4Egress is ENABLE_V4_EGRESS (default true, the reference's name):
	// in IPv6 mode each pod also gets a node-local IPv4 address, used only
	// for egress and SNATed to the node's primary IPv4 address (the
	// plugin's "enableV4Egress", which install-cni writes from it; it needs
	// the reference host-local plugin in the CNI bin dir). Ignored in IPv4
	// mode.
	V4Egress bool

	Cooldown        time.Duration // IP_COOLDOWN_PERIOD (seconds): a released address is not reused before this; default 30 s
	ReleaseInterval time.Duration // VPCIP_RELEASE_INTERVAL: at most one release of surplus per interval; default 30 s
	ENIMinAge       time.Duration // VPCIP_ENI_MIN_AGE: an ENI younger than this is not deleted; default 1 m

	// Datapath.
	MTU           int            // AWS_VPC_ENI_MTU, bytes, 576..9001; default 9001
	ExternalSNAT  bool           // AWS_VPC_K8S_CNI_EXTERNALSNAT: no SNAT rules on the node
	ExcludeSNAT   []netip.Prefix // AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS: comma-separated CIDRs kept un-SNATed
	RandomizeSNAT string         // AWS_VPC_K8S_CNI_RANDOMIZESNAT: "prng" (default) = --random-fully, "hashrandom" = --random, "none" = no flag
	VethPrefix    string         // AWS_VPC_K8S_CNI_VETHPREFIX, host veth name prefix; default "eni"
	SysctlNet     string         // VPCIP_SYSCTL_NET_DIR: the node's net.* sysctls (rp_filter of ENIs); default /proc/sys/net
	HostNetwork   bool           // VPCIP_HOSTNET: set up ENI links, tables, rules and SNAT; default true.
	// false is a test/dev knob: the daemon then runs without root or a node
	// netns, touching no host networking (and sees no pod routes).

	// Pods and the instance metadata service (hostnet.ChainIMDS).
	IMDSPodAccess       string   // VPCIP_IMDS_POD_ACCESS: "blocked" (default): pods reach IMDS only from IMDSAllowNamespaces; "all": every pod does (no filter)
	IMDSAllowNamespaces []string // VPCIP_IMDS_ALLOW_NAMESPACES: comma-separated namespaces whose pods may reach IMDS; default none

	LogLevel slog.Level // AWS_VPC_K8S_CNI_LOGLEVEL: DEBUG, INFO, WARN, ERROR; default INFO
	// LogFile is AWS_VPC_K8S_CNI_LOG_FILE: "" (default) logs to stderr only;
	// "stdout" or "stderr" to that stream only; an absolute path to stderr
	// and also to that file, rotated (package logfile). The AWS VPC CNI's
	// chart sets /host/var/log/aws-routed-eni/ipamd.log, which charts/vpcip
	// mounts from the host's /var/log/aws-routed-eni.
	LogFile string

	// Where new ENIs go (package ipamd/podsubnet).
	SubnetDiscovery bool // ENABLE_SUBNET_DISCOVERY: new ENIs in the zone's subnet with most free addresses among the node's and those tagged kubernetes.io/role/cni; default true
	// AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG: new ENIs take the subnet and
	// security groups of the node's ENIConfig, and the primary ENI holds no
	// pod address; default false. Takes precedence over SubnetDiscovery.
	CustomNetworking    bool
	ENIConfigAnnotation string // ENI_CONFIG_ANNOTATION_DEF: node annotation naming its ENIConfig; default k8s.amazonaws.com/eniConfig
	ENIConfigLabel      string // ENI_CONFIG_LABEL_DEF: node label naming its ENIConfig; default k8s.amazonaws.com/eniConfig

	// Daemon plumbing.
	ClusterName string // VPCIP_CLUSTER_NAME (alias CLUSTER_NAME), tagged on the ENIs the daemon creates and matched against kubernetes.io/cluster/<name> subnet tags; default "vpcip"
	NodeName    string // MY_NODE_NAME, the Kubernetes node name (tagged on ENIs, shown by introspection); default empty
	// Kubernetes (package ipamd/cluster; on when NodeName is set and an API
	// server is configured: Kubeconfig, or in a pod KUBERNETES_SERVICE_HOST).
	Kubeconfig     string        // VPCIP_KUBECONFIG (alias KUBECONFIG): kubeconfig file; default empty (in-cluster)
	PodLeakGrace   time.Duration // VPCIP_POD_LEAK_GRACE: an address whose pod is gone from the API server this long is released; default 2 m
	BudgetInterval time.Duration // VPCIP_BUDGET_INTERVAL: least time between AddressBudget status writes; default 15 s
	// VPCIP_COUNTS_INTERVAL: least time between two AddressBudget status
	// writes that change only the pool's counts (assigned, warm, cooling,
	// subnet free addresses): the counts shown are at most this old, while
	// a change a reader acts on (a condition, ENIs, capacity, readiness)
	// waits only BudgetInterval; default 1 m.
	CountsInterval time.Duration
	// VPCIP_EC2_BUDGET: "node" (each daemon paces its EC2 calls alone) or
	// "fleet" (the daemons share the account's EC2 request buckets through
	// Leases in Namespace, package ipamd/ec2budget; needs the Kubernetes
	// part); default "node".
	EC2Budget string
	// VPCIP_EC2_BUDGET_SHARE: percent of each account bucket the fleet
	// takes when EC2Budget is "fleet" (the rest is left to the account's
	// other callers); default 80.
	EC2BudgetShare int
	// VPCIP_EC2_BUDGET_SHARDS: how many Leases split each action's shared
	// bucket (ec2budget.Options.Shards; the same on every node); default 8.
	EC2BudgetShards int
	// VPCIP_NAMESPACE: the daemon's namespace, where
	// the fleet budget's Leases live; default kube-system.
	Namespace   string
	Socket      string // VPCIP_SOCKET, plugin API unix socket; default /run/vpcip/ipamd.sock
	Checkpoint  string // VPCIP_CHECKPOINT, allocation state file; default /var/run/vpcip/ipam.json
	MetricsAddr string // VPCIP_METRICS_ADDR (alias METRICS_BIND_ADDRESS); default :61678; "off" disables
	// MetricsSecure is VPCIP_METRICS_SECURE: /metrics over HTTPS, only for
	// scrapers whose bearer token the API server authenticates (TokenReview)
	// and allows get on the non-resource URL /metrics (SubjectAccessReview);
	// needs the Kubernetes API. Default false: plain HTTP, unauthenticated.
	MetricsSecure bool
	// MetricsTLSDir is VPCIP_METRICS_TLS_DIR: a directory holding tls.crt
	// and tls.key (PEM; the keys of a kubernetes.io/tls Secret mounted
	// there), the secure listener's certificate, read again when the files
	// change. Unset (the default), the daemon makes a self-signed
	// certificate in memory at start. Used only with MetricsSecure.
	MetricsTLSDir         string
	IntrospectionAddr     string        // VPCIP_INTROSPECTION_ADDR (alias INTROSPECTION_BIND_ADDRESS); default 127.0.0.1:61679; "off" disables
	AWSCNIMetricNames     bool          // VPCIP_METRICS_AWSCNI_NAMES: also export the AWS VPC CNI's awscni_* series; default false
	SubnetMetricsInterval time.Duration // VPCIP_SUBNET_METRICS_INTERVAL: how often to read the subnets' free addresses from EC2; default 30 m, at least 1 s
	AddWait               time.Duration // VPCIP_ADD_WAIT: how long an ADD waits for the pool to refill; default 5 s
	PoolInterval          time.Duration // VPCIP_POOL_INTERVAL: pool re-evaluation period; default 10 s
	ReconcileInterval     time.Duration // VPCIP_RECONCILE_INTERVAL: metadata comparison period; default 60 s
	ResyncInterval        time.Duration // VPCIP_RESYNC_INTERVAL: authoritative EC2 re-read period; default 5 m
	LeakSweepInterval     time.Duration // VPCIP_LEAK_SWEEP_INTERVAL: leaked-ENI sweep period; default 5 m
	LeakedENIGrace        time.Duration // VPCIP_LEAKED_ENI_GRACE: an available tagged ENI older than this is deleted; default 5 m
	GCGrace               time.Duration // VPCIP_GC_GRACE: GC spares assignments younger than this; default 60 s

	// install-cni.
	CNIBinDir      string        // VPCIP_CNI_BIN_DIR; default /opt/cni/bin
	CNIConfDir     string        // VPCIP_CNI_CONF_DIR; default /etc/cni/net.d
	CNIVersion     string        // VPCIP_CNI_VERSION, cniVersion of the conflist; default 1.1.0
	PluginSource   string        // VPCIP_CNI_PLUGIN_SRC, the vpcip-cni binary to copy; default: next to vpcipd
	PluginLogFile  string        // VPCIP_PLUGIN_LOG_FILE (or AWS_VPC_K8S_PLUGIN_LOG_FILE): a host path, rotated, or "stderr"; default /var/log/vpcip/plugin.log
	PluginLogLevel string        // VPCIP_PLUGIN_LOG_LEVEL; default the daemon's level
	InstallWait    time.Duration // VPCIP_INSTALL_WAIT: how long install-cni waits for the daemon to be ready; default 10 m
}

// Values of EC2Budget.
const (
	EC2BudgetNode  = "node"
	EC2BudgetFleet = "fleet"
)

// Defaults for the settings above.
const (
	DefaultSocket            = "/run/vpcip/ipamd.sock"
	DefaultCheckpoint        = "/var/run/vpcip/ipam.json"
	DefaultMetricsAddr       = ":61678"
	DefaultIntrospectionAddr = "127.0.0.1:61679"
	DefaultCNIBinDir         = "/opt/cni/bin"
	DefaultCNIConfDir        = "/etc/cni/net.d"
	DefaultCNIVersion        = "1.1.0"
	DefaultPluginLogFile     = "/var/log/vpcip/plugin.log"
	DefaultMTU               = 9001
	DefaultENIConfigKey      = "k8s.amazonaws.com/eniConfig" // the AWS VPC CNI's default of ENI_CONFIG_ANNOTATION_DEF and ENI_CONFIG_LABEL_DEF
)

// MinGCGrace is the least VPCIP_GC_GRACE accepted. A CNI GC's list of
// valid attachments (cni.dev/valid-attachments) is made by the runtime
// before it runs the plugin, so it can miss an ADD in flight: one the daemon
// answered while the runtime listed, or between the list and the plugin's
// call. GC spares assignments younger than the grace; shorter than the time
// from the runtime's list to the daemon's plan plus an ADD's time from its
// assignment to the runtime recording the sandbox (the rest of the plugin
// chain), it would let such a GC remove the new pod's veth and release its
// address. Both take well under a second on a healthy node; 10 s leaves
// room for a loaded one and for the plugin's own call timeout.
const MinGCGrace = 10 * time.Second

// VPCIP_IMDS_POD_ACCESS values.
const (
	// IMDSBlocked: pods reach the instance metadata service only from the
	// namespaces of VPCIP_IMDS_ALLOW_NAMESPACES (the default).
	IMDSBlocked = "blocked"
	// IMDSAll: every pod reaches it, as with the AWS VPC CNI (the hop limit
	// of the instance's metadata options then decides).
	IMDSAll = "all"
)

// SupportedCNIVersions are the cniVersion values install-cni may write:
// exactly those vpcip-cni's VERSION advertises (cni/plugin.Versions), so a
// node is never configured with a conflist its plugin refuses.
var SupportedCNIVersions = []string{"0.4.0", "1.0.0", "1.1.0"}

// Parse reads the configuration through getenv (os.Getenv in vpcipd), one
// row of Vars after another. It returns every problem found, joined; each
// names the variable, the value and the accepted form.
func Parse(getenv func(string) string) (Config, error) {
	p := &parser{getenv: getenv}
	var c Config
	for _, v := range Vars {
		v.read(p, p.setName(v), &c)
	}
	p.crossChecks(&c)
	return c, errors.Join(p.errs...)
}

// crossChecks reports combinations that make no sense on their own.
func (p *parser) crossChecks(c *Config) {
	if c.Socket == c.Checkpoint && c.Socket != "" {
		p.fail("VPCIP_SOCKET", c.Socket, "a path different from VPCIP_CHECKPOINT")
	}
	p.familyChecks(c)
	if c.MetricsSecure && c.MetricsAddr == "" {
		p.fail("VPCIP_METRICS_SECURE", "true", "false while VPCIP_METRICS_ADDR=off (there is no metrics listener to secure)")
	}
}

// familyChecks applies the AWS VPC CNI's rule for the address family: IPv4
// (ENABLE_IPv4=true, ENABLE_IPv6=false, the default), or IPv6 with prefix
// delegation and without IPv4 (ENABLE_IPv6=true, ENABLE_PREFIX_DELEGATION=true,
// ENABLE_IPv4=false). Dual stack and neither family are refused, as the
// reference refuses them at start.
func (p *parser) familyChecks(c *Config) {
	v6, _ := p.get("ENABLE_IPv6")
	v4, _ := p.get("ENABLE_IPv4")
	switch {
	case !c.IPv6 && c.IPv4:
	case c.IPv6 && c.IPv4:
		p.fail("ENABLE_IPv6", v6, "false while ENABLE_IPv4=true: dual stack is not supported; for IPv6 pods set ENABLE_IPv6=true, ENABLE_IPv4=false and ENABLE_PREFIX_DELEGATION=true")
	case !c.IPv6 && !c.IPv4:
		p.fail("ENABLE_IPv4", v4, "true while ENABLE_IPv6=false: one address family is needed; for IPv6 pods set ENABLE_IPv6=true, ENABLE_IPv4=false and ENABLE_PREFIX_DELEGATION=true")
	case !c.PrefixDelegation:
		p.fail("ENABLE_IPv6", v6, "false while ENABLE_PREFIX_DELEGATION=false: IPv6 pods take their addresses from a /80 prefix: set ENABLE_PREFIX_DELEGATION=true too (with ENABLE_IPv4=false)")
	}
}

// AdaptivePool reports that no warm variable is set (WARM_ENI_TARGET,
// WARM_IP_TARGET, MINIMUM_IP_TARGET and WARM_PREFIX_TARGET all unset or 0):
// the pool then runs vpcip's adaptive default (warmpool.Config.Adaptive).
// Any of them set keeps the AWS VPC CNI's semantics.
func (c Config) AdaptivePool() bool {
	return c.WarmENITarget == 0 && c.WarmIPTarget == 0 && c.MinimumIPTarget == 0 && c.WarmPrefixTarget == 0
}

// Notes are remarks on a valid but odd configuration, for the start-up log.
func (c Config) Notes() []string {
	var notes []string
	if c.WarmPrefixTarget > 0 && !c.PrefixDelegation {
		notes = append(notes, "WARM_PREFIX_TARGET is ignored unless ENABLE_PREFIX_DELEGATION=true")
	}
	if c.MetricsTLSDir != "" && !c.MetricsSecure {
		notes = append(notes, "VPCIP_METRICS_TLS_DIR is ignored unless VPCIP_METRICS_SECURE=true (metrics are served over plain HTTP)")
	}
	if !c.HostNetwork {
		notes = append(notes, "VPCIP_HOSTNET=false: no host networking is set up (test/dev mode)")
	}
	return notes
}

func levelName(l slog.Level) string {
	switch {
	case l <= slog.LevelDebug:
		return "DEBUG"
	case l <= slog.LevelInfo:
		return "INFO"
	case l <= slog.LevelWarn:
		return "WARN"
	}
	return "ERROR"
}
