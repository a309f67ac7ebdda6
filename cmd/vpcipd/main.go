// Command vpcipd is vpcip's node daemon: it keeps a warm pool of VPC
// addresses on the node's ENIs and hands them to the vpcip-cni plugin over a
// unix socket (see package ipamd).
//
// Usage:
//
//	vpcipd               run the daemon
//	vpcipd install-cni   wait until the daemon is ready, then install the
//	                     plugin binary and the conflist (DaemonSet init step)
//	vpcipd install-cni -stay
//	                     the same, then keep running until SIGTERM: the
//	                     DaemonSet's sidecar container (charts/vpcip), since a
//	                     container that exits is restarted by the kubelet
//	vpcipd -version      print the version
//
// All settings come from the environment (package ipamd/config lists every
// name, default and accepted form); the AWS SDK reads its own AWS_REGION,
// AWS_ENDPOINT_URL_EC2, AWS_EC2_METADATA_SERVICE_ENDPOINT and credentials.
// When AWS_REGION is unset the region is read from instance metadata.
// VPCIP_HOSTNET=false runs without touching host networking (no root
// needed): a test and development knob.
//
// Against vpcsim's in-process cloud (vpcsimtest.Start) from a test or a dev
// shell, with an instance launched there:
//
//	AWS_REGION=us-west-2 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x \
//	AWS_ENDPOINT_URL_EC2=<Local.EC2URL> \
//	AWS_EC2_METADATA_SERVICE_ENDPOINT=<Local.IMDSURL(instanceID)> \
//	VPCIP_HOSTNET=false VPCIP_SOCKET=/tmp/v/ipamd.sock VPCIP_CHECKPOINT=/tmp/v/ipam.json \
//	VPCIP_METRICS_ADDR=off VPCIP_INTROSPECTION_ADDR=127.0.0.1:0 vpcipd
//
// Inside a vpcsim fabric node netns (as root) host networking stays on and
// IMDS is http://169.254.169.254.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/vpcip/vpcip/ipamd"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/metricsauth"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/logfile"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("vpcipd", flag.ContinueOnError)
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: vpcipd [-version] [install-cni [-stay]]\n\nSettings come from the environment (package ipamd/config):\n  %s\n"+
			"and the AWS SDK's own (%s, credentials).\n",
			strings.Join(config.Names(), "\n  "), strings.Join(config.SDKNames, ", "))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println("vpcipd", version)
		return 0
	}
	cfg, err := config.Parse(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vpcipd: invalid configuration:\n%v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	switch fs.Arg(0) {
	case "":
		var closeLog func()
		if log, closeLog, err = daemonLog(cfg); err != nil {
			fmt.Fprintf(os.Stderr, "vpcipd: AWS_VPC_K8S_CNI_LOG_FILE: %v\n", err)
			return 2
		}
		defer closeLog()
		err = daemon(ctx, cfg, log)
	case "install-cni":
		sub := flag.NewFlagSet("vpcipd install-cni", flag.ContinueOnError)
		stay := sub.Bool("stay", false, "after installing, keep running until SIGTERM (a DaemonSet sidecar)")
		if err := sub.Parse(fs.Args()[1:]); err != nil {
			return 2
		}
		if err = installCNI(ctx, cfg, log); err == nil && *stay {
			log.Info("install-cni: installed; staying until SIGTERM")
			<-ctx.Done()
		}
	default:
		fs.Usage()
		return 2
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("vpcipd failed", "err", err)
		return 1
	}
	return 0
}

// daemonLog is the daemon's logger: JSON lines at cfg.LogLevel to stderr
// and, with AWS_VPC_K8S_CNI_LOG_FILE set to a path, also to that file,
// rotated (package logfile); set to stdout or stderr, to that stream only.
// install-cni logs to stderr only: its container does not mount the file's
// directory.
func daemonLog(cfg config.Config) (*slog.Logger, func(), error) {
	w, err := logfile.Open(cfg.LogFile, logfile.DefaultRotation)
	if err != nil {
		return nil, nil, err
	}
	var out io.Writer = os.Stderr
	closeLog := func() {}
	switch cfg.LogFile {
	case "":
	case logfile.Stdout, logfile.Stderr:
		out = w
	default:
		out = io.MultiWriter(os.Stderr, w)
		closeLog = func() { w.Close() }
	}
	return slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: cfg.LogLevel})), closeLog, nil
}

func daemon(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := ipamd.NewMetrics(reg)
	// First, as it can refuse the configuration (VPCIP_METRICS_SECURE
	// without an API server, a bad certificate).
	guard, err := newMetricsGuard(cfg, log)
	if err != nil {
		return err
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithEC2IMDSRegion())
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	prov, err := awsprovider.New(ctx, awsprovider.Options{
		ClusterName: cfg.ClusterName,
		NodeName:    cfg.NodeName,
		Observe:     metrics.ObserveCall,
		Logger:      log.With("component", "provider"),
		AWSConfig:   &awsCfg,
		Budget:      newEC2Budget(cfg, log),
	})
	if err != nil {
		return err
	}
	var host ipamd.Host = ipamd.NodeHost{SysctlNet: cfg.SysctlNet}
	if !cfg.HostNetwork {
		host = ipamd.NoHost{}
	}
	subnets := fleetmetrics.NewSubnets(reg, prov, cfg.SubnetMetricsInterval, log.With("component", "subnet-metrics"))
	// The Kubernetes part first: the daemon takes it as its source of pod
	// facts (demand, pods gone, a change signal) and as its status sink.
	kube := newCluster(cfg, log, reg, subnets, fleetmetrics.NewWithoutPod(reg))
	// New ENIs are placed by custom networking (the node's ENIConfig, read
	// from the API server), subnet discovery, or in the node's subnet. A
	// change of the node's ENIConfig wakes the daemon's worker.
	eniChanged := make(chan struct{}, 1)
	eniConfigs := newENIConfigs(cfg, log, func() {
		select {
		case eniChanged <- struct{}{}:
		default: // a wake-up is pending already
		}
	})
	var src podsubnet.ENIConfigSource
	if eniConfigs != nil {
		src = eniConfigs
	}
	placer := podsubnet.NewPlacer(prov, podsubnet.Settings{Custom: cfg.CustomNetworking, Discovery: cfg.SubnetDiscovery, Cluster: cfg.ClusterName},
		src, log.With("component", "podsubnet"), kube.NodeWarning)
	// With the AWS VPC CNI's names on, its series derived from ours live in
	// a registry of their own, read from reg at each scrape and served with
	// it (a collector on reg cannot gather reg).
	var gatherer prometheus.Gatherer = reg
	if cfg.AWSCNIMetricNames {
		awscni := prometheus.NewRegistry()
		fleetmetrics.RegisterAWSCNIDerived(awscni, reg)
		gatherer = prometheus.Gatherers{reg, awscni}
	}
	d, err := ipamd.New(ipamd.Options{
		Config: cfg, Provider: &podsubnet.Provider{Provider: prov, Placer: placer}, Host: host, Logger: log,
		Placement: placer.Last,
		Metrics:   metrics, Gatherer: gatherer, Version: version, MetricsGuard: guardOrNil(guard),
		Pods: liveFacts{kube}, Status: kube, Events: kube, Kubernetes: kubernetesState(kube), Wake: eniChanged,
	})
	if err != nil {
		return err
	}
	fleetmetrics.RegisterBuildInfo(reg, version, checkpoint.Version)
	if cfg.AWSCNIMetricNames {
		fleetmetrics.RegisterAWSCNINames(reg, func() api.Counts { return d.Status().Counts }, func() []fleetmetrics.CIDRUse { return cidrUse(d.State()) })
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(ctx) })
	g.Go(func() error { return subnets.Run(ctx) })
	g.Go(func() error { return kube.Run(ctx) })
	if eniConfigs != nil {
		g.Go(func() error { return eniConfigs.Run(ctx) })
	}
	return g.Wait()
}

// cidrUse lists the node's address blocks for the AWS VPC CNI's per-CIDR
// gauges: each ENI's /28 prefixes with how many of their addresses pods
// hold, or, on an ENI without prefixes, each secondary IP as a /32 held or
// not. ENI primary addresses are not pod addresses and are left out.
func cidrUse(st introspect.State) []fleetmetrics.CIDRUse {
	held := make(map[netip.Addr]bool, len(st.Assignments))
	for _, a := range st.Assignments {
		held[a.Address] = true
	}
	var out []fleetmetrics.CIDRUse
	for _, e := range st.ENIs {
		if len(e.Prefixes) > 0 {
			for _, p := range e.Prefixes {
				u := fleetmetrics.CIDRUse{CIDR: p}
				for a := range held {
					if p.Contains(a) {
						u.Assigned++
					}
				}
				out = append(out, u)
			}
			continue
		}
		for _, a := range e.Addresses {
			u := fleetmetrics.CIDRUse{CIDR: netip.PrefixFrom(a, 32)}
			if held[a] {
				u.Assigned = 1
			}
			out = append(out, u)
		}
	}
	return out
}

// guardOrNil keeps a nil *metricsauth.Guard from becoming a non-nil
// ipamd.MetricsGuard.
func guardOrNil(g *metricsauth.Guard) ipamd.MetricsGuard {
	if g == nil {
		return nil
	}
	return g
}
