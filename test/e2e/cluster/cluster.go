// Package cluster runs a vpcip cluster on vpcsim: an in-process EC2 model
// with its netns fabric, one vpcipd process per instance inside that
// instance's netns (reaching EC2 and IMDS through the fabric, exactly as on
// EC2: only the SDK's endpoint variables differ), the conflist that
// `vpcipd install-cni` writes, and podruntime to start pods through libcni.
// The demo and the end-to-end tests share it. It does not import testing.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// Options configure a cluster.
type Options struct {
	Prefix       string   // names of every netns and link start with it; unique per run, at most 6 characters
	Nodes        int      // instances, default 2
	InstanceType string   // default "m5.large"
	BinDir       string   // holds vpcipd, vpcip-cni, vpcipctl
	PluginDir    string   // optional: reference CNI plugins copied into each node's CNI bin dir
	DaemonEnv    []string // extra KEY=VALUE for every vpcipd (WARM_IP_TARGET=..., ...)
	Outside      bool     // add the outside host (203.0.113.10) reachable through SNAT
	WorkDir      string   // per-node state directories are made under it
	Sim          vpcsim.Config
	// NodeSubnets places node i in subnet NodeSubnets[i % len]; empty: every
	// node in the first subnet of Sim.
	NodeSubnets []string
	Logf        func(format string, args ...any) // progress lines; nil: silent
}

// Cluster is a running simulated cluster.
type Cluster struct {
	Options
	Cloud   *vpcsim.Cloud
	Fabric  *fabric.Fabric
	Nodes   []*Node
	EC2URL  string // as seen from inside an instance netns
	IMDSURL string // as seen from inside an instance netns
	Outside netip.Addr

	servers *fabric.Servers
	once    sync.Once
}

// Start builds the cluster: cloud, fabric, instances, daemons (ready), and
// each node's conflist. On error everything made so far is removed.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.InstanceType == "" {
		opts.InstanceType = "m5.large"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.Prefix == "" || len(opts.Prefix) > 6 {
		return nil, fmt.Errorf("cluster prefix %q: want 1 to 6 characters", opts.Prefix)
	}
	c = &Cluster{Options: opts}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if c.Cloud, err = vpcsim.New(opts.Sim); err != nil {
		return c, err
	}
	if c.Fabric, err = fabric.New(opts.Prefix); err != nil {
		return c, fmt.Errorf("fabric: %w", err)
	}
	c.Cloud.SetObserver(c.Fabric)
	if err := c.serve(); err != nil {
		return c, err
	}
	if opts.Outside {
		if c.Outside, err = c.Fabric.EnableOutsideHost(); err != nil {
			return c, fmt.Errorf("outside host: %w", err)
		}
	}
	for i := range opts.Nodes {
		n, err := c.launch(ctx, i)
		if err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	return c, nil
}

// serve starts the EC2 API and IMDS inside the fabric's router netns.
func (c *Cluster) serve() error {
	srv, err := c.Fabric.Serve(c.Cloud)
	if err != nil {
		return fmt.Errorf("serve EC2 API and IMDS in the fabric: %w", err)
	}
	c.servers = srv
	c.EC2URL, c.IMDSURL = fabric.EC2URL, fabric.IMDSURL
	return nil
}

func (c *Cluster) launch(ctx context.Context, i int) (*Node, error) {
	subnet := ""
	if len(c.NodeSubnets) > 0 {
		subnet = c.NodeSubnets[i%len(c.NodeSubnets)]
	}
	inst, err := c.Cloud.LaunchInstance(c.InstanceType, subnet)
	if err != nil {
		return nil, fmt.Errorf("launch instance %d: %w", i, err)
	}
	n := &Node{
		Name:       fmt.Sprintf("node-%d", i+1),
		InstanceID: inst.ID,
		PrimaryIP:  inst.PrimaryENI.PrimaryIP,
		Netns:      c.Fabric.NodeNetns(inst.ID),
		Dir:        filepath.Join(c.WorkDir, fmt.Sprintf("node-%d", i+1)),
		cluster:    c,
	}
	for _, d := range []string{n.Dir, n.confDir(), n.binDir(), n.cacheDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if c.PluginDir != "" {
		if err := copyDir(c.PluginDir, n.binDir()); err != nil {
			return nil, fmt.Errorf("copy reference plugins: %w", err)
		}
	}
	n.Runtime = &podruntime.Node{
		Netns:    n.Netns,
		ConfDir:  n.confDir(),
		BinDir:   n.binDir(),
		CacheDir: n.cacheDir(),
		Prefix:   fmt.Sprintf("%s-n%d", c.Prefix, i+1),
	}
	c.Logf("launched %s: %s (%s) in %s (%s) primary %s, netns %s", n.Name, inst.ID, c.InstanceType, inst.SubnetID, inst.AvailabilityZone, n.PrimaryIP, n.Netns)
	if err := n.StartDaemon(ctx); err != nil {
		return n, err
	}
	if err := n.InstallCNI(ctx); err != nil {
		return n, err
	}
	return n, nil
}

// Close stops every daemon and removes every pod netns, node netns, link and
// listener the cluster made. Safe to call more than once.
func (c *Cluster) Close() error {
	var errs []error
	c.once.Do(func() {
		for _, n := range c.Nodes {
			n.StopDaemon(false)
		}
		if c.servers != nil {
			errs = append(errs, c.servers.Close())
		}
		// The separator keeps cluster "ve391" off the namespaces of "ve3910".
		errs = append(errs, podruntime.CleanupNetns(c.Prefix+"-"))
		if c.Fabric != nil {
			errs = append(errs, c.Fabric.Close())
		}
		errs = append(errs, fabric.Cleanup(c.Prefix))
	})
	return errors.Join(errs...)
}

// Node finds a node by name ("node-1").
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func copyDir(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o755); err != nil {
			return err
		}
	}
	return nil
}
