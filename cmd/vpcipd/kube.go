package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vpcip/vpcip/ipamd"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/ec2budget"
	"github.com/vpcip/vpcip/ipamd/eniconfig"
	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/metricsauth"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/provider"
)

// The Kubernetes part is the daemon's source of pod facts, its status sink
// and its Event recorder; it implements them without importing the daemon.
var (
	_ ipamd.PodFacts          = (*cluster.Cluster)(nil)
	_ ipamd.StatusSink        = (*cluster.Cluster)(nil)
	_ ipamd.NoAddressRecorder = (*cluster.Cluster)(nil)
	_ ipamd.MetricsGuard      = (*metricsauth.Guard)(nil)
)

// kubeConfig is how the Kubernetes part reaches the API server:
// VPCIP_KUBECONFIG (or KUBECONFIG), else the pod's ServiceAccount when running
// in a cluster (KUBERNETES_SERVICE_HOST set); nil when neither, with why.
func kubeConfig(cfg config.Config) (*rest.Config, error) {
	if cfg.Kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, nil
	}
	return rest.InClusterConfig()
}

// newCluster wires the Kubernetes part. It never fails the daemon: a bad
// kubeconfig leaves the part disabled, with the reason in the log and in
// `vpcipctl status`. Subnet free counts come from the daemon's one cached
// DescribeSubnets (subnets).
func newCluster(cfg config.Config, log *slog.Logger, reg prometheus.Registerer,
	subnets *fleetmetrics.Subnets, withoutPod *fleetmetrics.WithoutPod) *cluster.Cluster {
	restCfg, err := kubeConfig(cfg)
	if err != nil {
		log.Error("kubernetes configuration unusable: running without the Kubernetes part", "err", err)
		restCfg = nil
	}
	c, err := cluster.New(cluster.Options{
		NodeName: cfg.NodeName, Config: restCfg, Subnets: subnets.Latest,
		Logger: log.With("component", "kubernetes"), Metrics: reg, WithoutPod: withoutPod,
		LeakGrace: cfg.PodLeakGrace, PublishInterval: cfg.BudgetInterval, CountsInterval: cfg.CountsInterval,
	})
	if err != nil {
		log.Error("kubernetes part not wired: running without it", "err", err)
		c, _ = cluster.New(cluster.Options{Metrics: reg, WithoutPod: withoutPod})
	}
	return c
}

// newEC2Budget is the fleet's shared EC2 budget (VPCIP_EC2_BUDGET=fleet),
// or nil: each daemon paces alone (the default, or when there is no API
// server to share it through, which is logged).
func newEC2Budget(cfg config.Config, log *slog.Logger) provider.RequestBudget {
	if cfg.EC2Budget != config.EC2BudgetFleet {
		return nil
	}
	restCfg, err := kubeConfig(cfg)
	if err != nil || restCfg == nil || cfg.NodeName == "" {
		log.Warn("VPCIP_EC2_BUDGET=fleet needs the Kubernetes part (MY_NODE_NAME and an API server): pacing EC2 calls alone", "err", err)
		return nil
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err == nil {
		var b *ec2budget.Budget
		if b, err = ec2budget.New(ec2budget.Options{Client: cs, Namespace: cfg.Namespace, NodeName: cfg.NodeName,
			Share: float64(cfg.EC2BudgetShare) / 100, Shards: cfg.EC2BudgetShards, Logger: log.With("component", "ec2budget")}); err == nil {
			log.Info("EC2 calls share the fleet's budget", "namespace", cfg.Namespace, "share", cfg.EC2BudgetShare, "shards", cfg.EC2BudgetShards, "home", b.Home())
			return b
		}
	}
	log.Error("fleet EC2 budget not wired: pacing EC2 calls alone", "err", err)
	return nil
}

// kubernetesState is the Kubernetes part's health in introspection's shape
// (`vpcipctl status`).
// liveFacts is the Kubernetes part as the daemon's PodFacts, with Live
// (the pool's warmpool.Demand.Bindings): its view of the node's pods is
// trustworthy now — enabled and connected (caches synced, no API error
// outstanding) — so pods show there at their binding, before their ADDs.
type liveFacts struct{ *cluster.Cluster }

func (f liveFacts) Live() bool {
	h := f.Health()
	return h.Enabled && h.Connected
}

func kubernetesState(c *cluster.Cluster) func() introspect.Kubernetes {
	return func() introspect.Kubernetes {
		h := c.Health()
		return introspect.Kubernetes{Enabled: h.Enabled, Connected: h.Connected, Reason: h.Reason}
	}
}

// newENIConfigs is custom networking's ENIConfig reader, or nil when custom
// networking is off or there is no API server to read from (the placer then
// makes no ENI and says why). changed is called when the node's ENIConfig
// may have changed.
func newENIConfigs(cfg config.Config, log *slog.Logger, changed func()) *eniconfig.Source {
	if !cfg.CustomNetworking {
		return nil
	}
	restCfg, err := kubeConfig(cfg)
	if err != nil || restCfg == nil || cfg.NodeName == "" {
		log.Warn("custom networking needs the Kubernetes part (MY_NODE_NAME and an API server) to read ENIConfigs; no ENI is made without one", "err", err)
		return nil
	}
	src, err := eniconfig.New(eniconfig.Options{Config: restCfg, NodeName: cfg.NodeName,
		Keys:   podsubnet.NodeKeys{Annotation: cfg.ENIConfigAnnotation, Label: cfg.ENIConfigLabel},
		Logger: log.With("component", "eniconfig"), Changed: changed})
	if err != nil {
		log.Error("custom networking: ENIConfig reader not wired", "err", err)
		return nil
	}
	return src
}

// newMetricsGuard is the secure metrics listener's guard
// (VPCIP_METRICS_SECURE), or nil when it is off. Unlike the Kubernetes
// part, it fails the daemon: without an API server to review tokens the
// listener could only refuse every scrape or serve everyone, and an
// operator who asked for authorization gets neither silently. Its client
// is its own, limited to 5 requests/s (burst 10), so a flood of bogus
// tokens never delays the Kubernetes part's watches and writes.
func newMetricsGuard(cfg config.Config, log *slog.Logger) (*metricsauth.Guard, error) {
	if !cfg.MetricsSecure {
		return nil, nil
	}
	restCfg, err := kubeConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("VPCIP_METRICS_SECURE=true: the Kubernetes API configuration is unusable: %w", err)
	}
	if restCfg == nil {
		return nil, errors.New("VPCIP_METRICS_SECURE=true needs the Kubernetes API to review scrapers' tokens: " +
			"set VPCIP_KUBECONFIG, or run in a cluster (KUBERNETES_SERVICE_HOST), or set VPCIP_METRICS_SECURE=false")
	}
	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst = 5, 10
	restCfg.UserAgent = "vpcipd/" + version + " metrics-auth"
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("VPCIP_METRICS_SECURE=true: Kubernetes client: %w", err)
	}
	hosts := []string{cfg.NodeName}
	if h, _, err := net.SplitHostPort(cfg.MetricsAddr); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	return metricsauth.New(metricsauth.Options{Client: cs, TLSDir: cfg.MetricsTLSDir, Hosts: hosts,
		Logger: log.With("component", "metrics-auth")})
}
