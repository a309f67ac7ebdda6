package ipamd

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/provider"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// itypeSmall is docs/field-failures.md's itype-small: 3 ENIs × 10 IPv4 addresses.
const itypeSmall = "m5.large"

const testCluster = "vpcip-test"

// clock is the daemon's injected clock; tests move it by hand. It starts at
// the real time, never behind it: ENI attachment times come from vpcsim's
// wall clock, and an ENI attached "after" the daemon's now would never be
// old enough to delete.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().UTC().Truncate(time.Second)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// cloud is a vpcsim EC2 API and IMDS on loopback.
type cloud struct {
	*vpcsimtest.Local
}

func startCloud(t testing.TB, subnets ...vpcsim.SubnetSpec) cloud {
	t.Helper()
	return cloud{vpcsimtest.Start(t, vpcsim.Config{Subnets: subnets, Seed: 1})}
}

// awsConfig is an SDK configuration for the sim's EC2 API and an instance's IMDS.
func (c cloud) awsConfig(t testing.TB, instanceID string) aws.Config {
	t.Helper()
	cfg, err := awsconfig.LoadDefaultConfig(context.Background(),
		awsconfig.WithRegion("us-west-2"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDVPCIPTEST", "secret", "")),
		awsconfig.WithBaseEndpoint(c.EC2URL),
		awsconfig.WithEC2IMDSEndpoint(c.IMDSURL(instanceID)),
		awsconfig.WithSharedConfigFiles([]string{}),
		awsconfig.WithSharedCredentialsFiles([]string{}),
	)
	if err != nil {
		t.Fatalf("SDK config: %v", err)
	}
	return cfg
}

// provider is the real EC2/IMDS provider for an instance, with fast test
// pacing. A throttled call is waited out for up to 30 s (production: 2 min)
// rather than abandoned: abandoning a start-up Describe under a fleet-wide
// throttle only repeats it (B08).
func (c cloud) provider(t testing.TB, instanceID string, observe provider.CallObserver) *awsprovider.Client {
	t.Helper()
	cfg := c.awsConfig(t, instanceID)
	p, err := awsprovider.New(context.Background(), awsprovider.Options{
		ClusterName: testCluster, NodeName: "node-" + instanceID,
		MutatingRate: 1000, MutatingBurst: 100, DescribeRate: 1000, DescribeBurst: 100,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, MaxThrottleWait: 30 * time.Second,
		MetadataWait: 5 * time.Second, MetadataPoll: 10 * time.Millisecond,
		DetachWait: 5 * time.Second, DetachPoll: 10 * time.Millisecond,
		Observe: observe, AWSConfig: &cfg,
	})
	if err != nil {
		t.Fatalf("provider: %v", err)
	}
	return p
}

// raw is an EC2 client outside the daemon, for out-of-band actions.
func (c cloud) raw(t testing.TB, instanceID string) *ec2.Client {
	return ec2.NewFromConfig(c.awsConfig(t, instanceID))
}

// testConfig is the daemon config for tests: files under dir, no TCP
// listeners, no host networking, overrides from env.
func testConfig(t testing.TB, dir string, env map[string]string) config.Config {
	t.Helper()
	vars := map[string]string{
		"VPCIP_SOCKET":             filepath.Join(dir, "s.sock"),
		"VPCIP_CHECKPOINT":         filepath.Join(dir, "state", "ipam.json"),
		"VPCIP_METRICS_ADDR":       "off",
		"VPCIP_INTROSPECTION_ADDR": "off",
		"VPCIP_HOSTNET":            "false",
		"VPCIP_ADD_WAIT":           "2s",
		"VPCIP_CLUSTER_NAME":       testCluster,
		"VPCIP_ENI_MIN_AGE":        "0s",
	}
	for k, v := range env {
		vars[k] = v
	}
	// These tests were written for ENI-granular growth (the AWS VPC CNI
	// default): a test that names no warm variable gets WARM_ENI_TARGET=1.
	// The adaptive default's tests name one, empty.
	named := false
	for _, k := range []string{"WARM_ENI_TARGET", "WARM_IP_TARGET", "MINIMUM_IP_TARGET", "WARM_PREFIX_TARGET"} {
		_, ok := env[k]
		named = named || ok
	}
	if !named {
		vars["WARM_ENI_TARGET"] = "1"
	}
	cfg, err := config.Parse(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// shortDir is a directory with a short path (unix socket paths are limited
// to 107 bytes), removed when the test ends.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vpcipd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// node is one daemon on one vpcsim instance.
type node struct {
	t      testing.TB
	cloud  cloud
	inst   vpcsim.InstanceInfo
	dir    string
	env    map[string]string
	clock  *clock
	reg    *prometheus.Registry
	prov   provider.Provider
	host   Host
	d      *Daemon
	client *api.Client
	stop   context.CancelFunc
	done   chan error
	// wrap, if set, wraps the provider (e.g. to stage instance metadata).
	wrap func(provider.Provider) provider.Provider
	// pods and sink, if set, stand in for the Kubernetes part.
	pods PodFacts
	sink StatusSink
	// guard, if set, secures the metrics listener (Options.MetricsGuard).
	guard MetricsGuard
}

func newNode(t testing.TB, c cloud, instanceType string, env map[string]string) *node {
	t.Helper()
	if env == nil {
		env = map[string]string{}
	}
	n := &node{t: t, cloud: c, inst: c.Launch(t, instanceType), dir: shortDir(t), env: env, clock: newClock()}
	return n
}

// start runs a daemon (again) on the node's files and waits until it is ready.
func (n *node) start() {
	n.t.Helper()
	n.startNoWait()
	select {
	case <-n.d.Ready():
	case err := <-n.done:
		n.t.Fatalf("daemon exited before ready: %v", err)
	case <-time.After(20 * time.Second):
		n.t.Fatalf("daemon not ready: %s", n.d.Status().Reason)
	}
	n.cycle() // the first pool cycle has run
}

func (n *node) startNoWait() {
	n.t.Helper()
	n.reg = prometheus.NewRegistry()
	m := NewMetrics(n.reg)
	var p provider.Provider = n.cloud.provider(n.t, n.inst.ID, m.ObserveCall)
	if n.wrap != nil {
		p = n.wrap(p)
	}
	n.prov = p
	d, err := New(Options{Config: testConfig(n.t, n.dir, n.env), Provider: p, Host: n.host,
		Metrics: m, Gatherer: n.reg, Clock: n.clock.Now, Pods: n.pods, Status: n.sink,
		NetnsDirs: []string{n.netnsDir()}, MetricsGuard: n.guard})
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.d, n.stop, n.done = d, cancel, make(chan error, 1)
	go func() { n.done <- d.Run(ctx) }()
	n.client = api.NewClient(d.cfg.Socket, 10*time.Second)
	n.t.Cleanup(n.shutdown)
}

// shutdown stops the daemon (SIGTERM path) and waits for it.
func (n *node) shutdown() {
	if n.stop == nil {
		return
	}
	n.stop()
	select {
	case err := <-n.done:
		if err != nil {
			n.t.Errorf("daemon Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		n.t.Error("daemon did not stop")
	}
	n.stop = nil
}

// restart stops the daemon and starts a new one on the same files.
func (n *node) restart() {
	n.t.Helper()
	n.shutdown()
	n.start()
}

// cycle runs fn (may be nil) and a pool cycle on the worker, and waits.
func (n *node) cycle(fns ...func(context.Context)) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var fn func(context.Context)
	if len(fns) > 0 {
		fn = fns[0]
	}
	if !n.d.work.onWorker(ctx, fn) {
		n.t.Fatal("worker did not run the cycle")
	}
}

// reconcile runs a periodic (metadata-first) reconciliation on the worker.
func (n *node) reconcile() { n.cycle(func(ctx context.Context) { n.d.rec.reconcile(ctx, false) }) }

func key(c string) api.Key { return api.Key{Network: "vpcip", ContainerID: c, IfName: "eth0"} }

// netnsDir is where the node's runtime keeps its sandboxes' netns files
// (the daemon's witness that a pod is gone, see netnsWitness).
func (n *node) netnsDir() string {
	d := filepath.Join(n.dir, "netns")
	if err := os.MkdirAll(d, 0o755); err != nil {
		n.t.Fatal(err)
	}
	return d
}

// add is ADD(c): an assign through the socket for pod p-<c>, whose sandbox
// netns is a file in netnsDir (made if missing).
func (n *node) add(c string) (api.Assignment, error) {
	netns := filepath.Join(n.netnsDir(), c)
	if err := os.WriteFile(netns, nil, 0o600); err != nil {
		n.t.Fatal(err)
	}
	return n.client.Assign(context.Background(), api.AssignRequest{Key: key(c), Pod: api.Pod{Namespace: "default", Name: "p-" + c}, Netns: netns})
}

// dropSandbox removes c's sandbox netns, as a runtime that lost the
// sandbox without a DEL (or a node reboot) does.
func (n *node) dropSandbox(c string) {
	if err := os.Remove(filepath.Join(n.netnsDir(), c)); err != nil && !os.IsNotExist(err) {
		n.t.Fatal(err)
	}
}

func (n *node) mustAdd(c string) api.Assignment {
	n.t.Helper()
	a, err := n.add(c)
	if err != nil {
		n.t.Fatalf("ADD(%s): %v", c, err)
	}
	return a
}

func (n *node) del(c string) api.ReleaseResponse {
	n.t.Helper()
	r, err := n.client.Release(context.Background(), api.ReleaseRequest{Key: key(c)})
	if err != nil {
		n.t.Fatalf("DEL(%s): %v", c, err)
	}
	return r
}

func (n *node) status() api.Status {
	n.t.Helper()
	s, err := n.client.Status(context.Background())
	if err != nil {
		n.t.Fatalf("status: %v", err)
	}
	return s
}

// cloudAddrs is what EC2 (the model) shows on the node's ENIs: address → ENI.
func (n *node) cloudAddrs() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, e := range n.cloud.Cloud.NetworkInterfaces() {
		if e.InstanceID != n.inst.ID {
			continue
		}
		for _, a := range e.SecondaryIPs {
			out[a] = e.ID
		}
		for _, p := range e.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				out[a] = e.ID
			}
		}
	}
	return out
}

// checkInvariants: one owner per address, one address per key, and every
// assigned address is on the ENI the datastore says, per the cloud.
func (n *node) checkInvariants() {
	n.t.Helper()
	cloud := n.cloudAddrs()
	byAddr := map[netip.Addr]api.Key{}
	byKey := map[api.Key]bool{}
	for _, a := range n.d.store.Assignments() {
		if k, dup := byAddr[a.Address]; dup {
			n.t.Errorf("address %s held by %s and %s", a.Address, k, a.Key)
		}
		if byKey[a.Key] {
			n.t.Errorf("key %s holds two addresses", a.Key)
		}
		byAddr[a.Address], byKey[a.Key] = a.Key, true
		if eni, ok := cloud[a.Address]; !ok || eni != a.ENIID {
			n.t.Errorf("assigned %s (%s) is on %q in the cloud, datastore says %q", a.Address, a.Key, eni, a.ENIID)
		}
	}
}

// eventually polls cond until it holds or the bound passes; the bound is a
// safety net for asynchronous work, not a performance assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// checkMirror compares, on the worker (so no cloud change is in flight), the
// addresses the datastore has on the node's ENIs with those the cloud shows:
// they must be equal.
func (n *node) checkMirror() {
	n.t.Helper()
	var diffs []string
	n.cycle(func(context.Context) {
		have := map[netip.Addr]string{}
		for _, e := range n.d.store.ENIs() {
			for _, s := range e.Slots {
				for a := s.Addr(); s.Contains(a); a = a.Next() {
					have[a] = e.ID
				}
			}
		}
		cloud := n.cloudAddrs()
		for a, eni := range cloud {
			if have[a] != eni {
				diffs = append(diffs, fmt.Sprintf("%s on %s in the cloud, on %q in the datastore", a, eni, have[a]))
			}
		}
		for a, eni := range have {
			if _, ok := cloud[a]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s on %s in the datastore only", a, eni))
			}
		}
	})
	for _, d := range diffs {
		n.t.Error(d)
	}
}
