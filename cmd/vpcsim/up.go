package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

func runUp(args []string) error {
	var c commonFlags
	fs := newFlagSet("up", &c)
	nodes := fs.Int("nodes", 2, "instances to launch")
	itype := fs.String("instance-type", "m5.large", "EC2 instance type of every node")
	outside := fs.Bool("outside", false, "add the outside host 203.0.113.10, reachable from node primary addresses")
	seed := fs.Int64("seed", 0, "non-zero: deterministic IDs and MACs")
	zones := fs.Int("zones", 1, "spread the nodes over this many zones (1-3), each node in its zone's subnet")
	limits := fs.String("request-limits", "off", "the account's EC2 request buckets: aws (EC2's documented per-action sizes and refill rates, shared by every instance) or off")
	podSubnets := fs.Bool("pod-subnets", false, "add the secondary VPC CIDR 100.65.0.0/16 with one /20 per zone tagged kubernetes.io/role/cni=1, and a \"pods\" security group")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *nodes < 1 {
		return fmt.Errorf("--nodes %d: want at least 1", *nodes)
	}
	if *zones < 1 || *zones > 3 {
		return fmt.Errorf("--zones %d: want 1 to 3", *zones)
	}
	if *limits != "aws" && *limits != "off" {
		return fmt.Errorf("--request-limits %q: want aws or off", *limits)
	}
	if s, err := readState(statePath(c)); err == nil {
		if upRunning(s.PID) {
			return fmt.Errorf("already up (pid %d); run vpcsim down --prefix %s first", s.PID, c.prefix)
		}
		return fmt.Errorf("%s is left from a run that stopped (pid %d); run vpcsim down --prefix %s first", statePath(c), s.PID, c.prefix)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	r := &upRun{flags: c, log: log}
	r.awsLimits = *limits == "aws"
	err := r.start(simConfig(*seed, *podSubnets), *nodes, *zones, *itype, *outside)
	if err == nil {
		r.print(os.Stdout)
		<-ctx.Done()
		log.Info("stopping")
	}
	return errors.Join(err, r.stop())
}

// upRun is a running vpcsim: cloud, fabric, servers and state file.
type upRun struct {
	flags commonFlags
	// awsLimits turns on EC2's documented request buckets (--request-limits aws).
	awsLimits bool
	log       *slog.Logger
	fab       *fabric.Fabric
	servers   *fabric.Servers
	http      []*http.Server // on loopback: admin, EC2
	state     state
}

// Layout of `vpcsim up`: node subnets are the default /20 per zone of
// 100.64.0.0/16; --pod-subnets adds podsCIDR with a /20 per zone.
var (
	zoneLetters = []string{"a", "b", "c"}
	podsCIDR    = netip.MustParsePrefix("100.65.0.0/16")
)

// simConfig is the VPC of `vpcsim up`: the default layout, plus the pod
// subnets and their security group with podSubnets.
func simConfig(seed int64, podSubnets bool) vpcsim.Config {
	cfg := vpcsim.Config{Seed: seed}
	if !podSubnets {
		return cfg
	}
	cfg.SecondaryVPCCIDRs = []netip.Prefix{podsCIDR}
	for i, z := range zoneLetters {
		a := podsCIDR.Addr().As4()
		a[2] = byte(16 * i)
		cfg.Subnets = append(cfg.Subnets, vpcsim.SubnetSpec{CIDR: netip.MustParsePrefix("100.64." + strconv.Itoa(16*i) + ".0/20"), AvailabilityZone: "us-west-2" + z})
		cfg.Subnets = append(cfg.Subnets, vpcsim.SubnetSpec{CIDR: netip.PrefixFrom(netip.AddrFrom4(a), 20), AvailabilityZone: "us-west-2" + z,
			Tags: map[string]string{"kubernetes.io/role/cni": "1", "Name": "pods-" + z}})
	}
	cfg.SecurityGroups = []vpcsim.SecurityGroupSpec{{Name: "pods", Description: "pod ENIs"}}
	return cfg
}

func (r *upRun) start(cfg vpcsim.Config, nodes, zones int, itype string, outside bool) error {
	cloud, err := vpcsim.New(cfg)
	if err != nil {
		return err
	}
	if r.awsLimits {
		cloud.Faults().SetRequestLimits(vpcsim.AWSRequestLimits())
	}
	if r.fab, err = fabric.New(r.flags.prefix); err != nil {
		return fmt.Errorf("%w (vpcsim down --prefix %s removes what a crashed run left)", err, r.flags.prefix)
	}
	r.fab.SetLogger(r.log)
	cloud.SetObserver(r.fab)
	if r.servers, err = r.fab.Serve(cloud); err != nil {
		return err
	}
	adminURL, err := r.serveLocal(cloud.AdminHandler())
	if err != nil {
		return err
	}
	localEC2, err := r.serveLocal(cloud.EC2Handler())
	if err != nil {
		return err
	}
	r.state = state{
		Version: stateVersion, Prefix: r.flags.prefix, PID: os.Getpid(), Region: cloud.Region(),
		EC2URL: fabric.EC2URL, IMDSURL: fabric.IMDSURL, LocalEC2URL: localEC2, AdminURL: adminURL,
		RouterNetns: r.fab.RouterNetns(),
	}
	if outside {
		addr, err := r.fab.EnableOutsideHost()
		if err != nil {
			return err
		}
		r.state.OutsideAddr, r.state.OutsideNetns = addr.String(), r.fab.OutsideNetns()
	}
	var nodeSubnets []string // by zone
	for _, sub := range cloud.Subnets() {
		if _, pod := sub.Tags["kubernetes.io/role/cni"]; pod {
			r.state.PodSubnets = append(r.state.PodSubnets, subnetState{ID: sub.ID, CIDR: sub.CIDR.String(), Zone: sub.AvailabilityZone})
		} else if len(nodeSubnets) < zones {
			nodeSubnets = append(nodeSubnets, sub.ID)
		}
	}
	for _, g := range cloud.SecurityGroups() {
		if g.Name == "pods" {
			r.state.PodSecurityGroup = g.ID
		}
	}
	for i := range nodes {
		inst, err := cloud.LaunchInstance(itype, nodeSubnets[i%len(nodeSubnets)])
		if err != nil {
			return fmt.Errorf("launch node%d: %w", i+1, err)
		}
		eni := inst.PrimaryENI
		r.state.Nodes = append(r.state.Nodes, node{
			Name: fmt.Sprintf("node%d", i+1), InstanceID: inst.ID, InstanceType: inst.Type,
			Netns: r.fab.NodeNetns(inst.ID), PrimaryIP: eni.PrimaryIP.String(), MAC: eni.MAC, ENI: eni.ID, SubnetID: inst.SubnetID,
			Zone: inst.AvailabilityZone,
		})
	}
	if err := r.fab.Err(); err != nil {
		return err
	}
	return writeState(statePath(r.flags), &r.state)
}

// serveLocal serves h on a free loopback port and returns its base URL.
func (r *upRun) serveLocal(h http.Handler) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	r.http = append(r.http, srv)
	go func() { _ = srv.Serve(l) }() // http.ErrServerClosed once stop closes it
	return "http://" + l.Addr().String(), nil
}

// stop tears everything down; what was never started is skipped.
func (r *upRun) stop() error {
	var errs []error
	for _, srv := range r.http {
		errs = append(errs, srv.Close())
	}
	if r.servers != nil {
		errs = append(errs, r.servers.Close())
	}
	if r.fab != nil {
		// Cleanup first: it also stops processes run in the nodes (vpcsim
		// exec), which Close alone would leave in nameless netns.
		errs = append(errs, fabric.Cleanup(r.flags.prefix), r.fab.Close())
	}
	if err := os.Remove(statePath(r.flags)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (r *upRun) print(w io.Writer) {
	s := &r.state
	fmt.Fprintf(w, "vpcsim up (pid %d), prefix %q, region %s, state in %s\n", s.PID, s.Prefix, s.Region, statePath(r.flags))
	fmt.Fprintf(w, "  EC2 API  %s from every node, %s from this host\n", s.EC2URL, s.LocalEC2URL)
	fmt.Fprintf(w, "  IMDS     %s from every node\n", s.IMDSURL)
	fmt.Fprintf(w, "  admin    %s (vpcsim fault, vpcsim status)\n", s.AdminURL)
	if s.OutsideAddr != "" {
		fmt.Fprintf(w, "  outside  %s (netns %s), reachable from node primary addresses\n", s.OutsideAddr, s.OutsideNetns)
	}
	for _, p := range s.PodSubnets {
		fmt.Fprintf(w, "  pods     %s %s in %s, tagged kubernetes.io/role/cni=1 (security group %s)\n", p.ID, p.CIDR, p.Zone, s.PodSecurityGroup)
	}
	for _, n := range s.Nodes {
		fmt.Fprintf(w, "  %s  %s %s  %s  %s  netns %s\n", n.Name, n.InstanceID, n.InstanceType, n.Zone, n.PrimaryIP, n.Netns)
		fmt.Fprintf(w, "         vpcsim exec --prefix %s %s -- <command>\n", s.Prefix, n.Name)
	}
	fmt.Fprintf(w, "stop with Ctrl-C or vpcsim down --prefix %s\n", s.Prefix)
}
