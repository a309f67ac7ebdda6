package config

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// Map is the effective configuration by variable name, for the start-up log
// line and the introspection endpoint. Durations are Go durations.
func (c Config) Map() map[string]string {
	cidrs := make([]string, len(c.ExcludeSNAT))
	for i, p := range c.ExcludeSNAT {
		cidrs[i] = p.String()
	}
	d := func(v time.Duration) string { return v.String() }
	i := strconv.Itoa
	b := strconv.FormatBool
	return map[string]string{
		"WARM_ENI_TARGET":                    i(c.WarmENITarget),
		"WARM_IP_TARGET":                     i(c.WarmIPTarget),
		"MINIMUM_IP_TARGET":                  i(c.MinimumIPTarget),
		"WARM_PREFIX_TARGET":                 i(c.WarmPrefixTarget),
		"ENABLE_PREFIX_DELEGATION":           b(c.PrefixDelegation),
		"MAX_ENI":                            i(c.MaxENI),
		"VPCIP_MAX_PODS":                     i(c.MaxPods),
		"IP_COOLDOWN_PERIOD":                 d(c.Cooldown),
		"VPCIP_RELEASE_INTERVAL":             d(c.ReleaseInterval),
		"VPCIP_ENI_MIN_AGE":                  d(c.ENIMinAge),
		"AWS_VPC_ENI_MTU":                    i(c.MTU),
		"AWS_VPC_K8S_CNI_EXTERNALSNAT":       b(c.ExternalSNAT),
		"AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": strings.Join(cidrs, ","),
		"AWS_VPC_K8S_CNI_RANDOMIZESNAT":      map[bool]string{true: "prng", false: "none"}[c.RandomFully],
		"AWS_VPC_K8S_CNI_VETHPREFIX":         c.VethPrefix,
		"VPCIP_HOSTNET":                      b(c.HostNetwork),
		"AWS_VPC_K8S_CNI_LOGLEVEL":           levelName(c.LogLevel),
		"VPCIP_CLUSTER_NAME":                 c.ClusterName,
		"MY_NODE_NAME":                       c.NodeName,
		"VPCIP_SOCKET":                       c.Socket,
		"VPCIP_CHECKPOINT":                   c.Checkpoint,
		"VPCIP_METRICS_ADDR":                 c.MetricsAddr,
		"VPCIP_INTROSPECTION_ADDR":           c.IntrospectionAddr,
		"VPCIP_ADD_WAIT":                     d(c.AddWait),
		"VPCIP_POOL_INTERVAL":                d(c.PoolInterval),
		"VPCIP_RECONCILE_INTERVAL":           d(c.ReconcileInterval),
		"VPCIP_RESYNC_INTERVAL":              d(c.ResyncInterval),
		"VPCIP_LEAK_SWEEP_INTERVAL":          d(c.LeakSweepInterval),
		"VPCIP_LEAKED_ENI_GRACE":             d(c.LeakedENIGrace),
		"VPCIP_GC_GRACE":                     d(c.GCGrace),
		"VPCIP_CNI_BIN_DIR":                  c.CNIBinDir,
		"VPCIP_CNI_CONF_DIR":                 c.CNIConfDir,
		"VPCIP_CNI_VERSION":                  c.CNIVersion,
		"VPCIP_CNI_PLUGIN_SRC":               c.PluginSource,
		"VPCIP_PLUGIN_LOG_FILE":              c.PluginLogFile,
		"VPCIP_PLUGIN_LOG_LEVEL":             c.PluginLogLevel,
		"VPCIP_INSTALL_WAIT":                 d(c.InstallWait),
	}
}

// Names lists every variable Parse reads, aliases included (for the chart
// test that checks its env names against the daemon's).
func Names() []string {
	m := Config{}.Map()
	names := make([]string, 0, len(m)+2)
	for k := range m {
		names = append(names, k)
	}
	names = append(names, "METRICS_BIND_ADDRESS", "INTROSPECTION_BIND_ADDRESS")
	slices.Sort(names)
	return names
}
