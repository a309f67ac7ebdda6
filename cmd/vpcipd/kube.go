package main

import (
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vpcip/vpcip/ipamd"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/eniconfig"
	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
)

// The Kubernetes part is the daemon's source of pod facts, its status sink
// and its Event recorder; it implements them without importing the daemon.
var (
	_ ipamd.PodFacts          = (*cluster.Cluster)(nil)
	_ ipamd.StatusSink        = (*cluster.Cluster)(nil)
	_ ipamd.NoAddressRecorder = (*cluster.Cluster)(nil)
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
		LeakGrace: cfg.PodLeakGrace, PublishInterval: cfg.BudgetInterval,
	})
	if err != nil {
		log.Error("kubernetes part not wired: running without it", "err", err)
		c, _ = cluster.New(cluster.Options{Metrics: reg, WithoutPod: withoutPod})
	}
	return c
}

// kubernetesState is the Kubernetes part's health in introspection's shape
// (`vpcipctl status`).
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
