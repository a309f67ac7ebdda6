package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/ec2budget"
	"github.com/vpcip/vpcip/ipamd/eniconfig"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/kubetest"
)

// TestRBACEveryVerbIsNeeded runs the cluster part as a ServiceAccount bound to
// exactly charts/vpcip/files/clusterrole-rules.yaml and shows everything works;
// then, for each verb of each rule, binds the rules without that verb and
// shows the same scenario fails. A verb the code does not use, or one the
// code needs and the file lacks, fails this test rather than a user.
//
// A scenario without a needed verb waits its whole deadline for what does
// not happen, so the reduced rule sets run all at once, each with its own
// ServiceAccount and nodes (as subtests with t.Parallel they would run
// GOMAXPROCS at a time: a minute on two cores instead of seconds).
func TestRBACEveryVerbIsNeeded(t *testing.T) {
	k := kubetest.Shared(t)
	admin, _ := setup(t, k)
	rules, err := kubetest.ReadRules(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// prepare binds the rules to a new ServiceAccount and sets the scenario
	// up (in the test's goroutine: it may fail the test); the scenario runs
	// when the returned function is called.
	prepare := func(name string, rules []rbacv1.PolicyRule) func() error {
		cfg, err := k.ServiceAccountConfig(ctx, "kube-system", name, rules)
		if err != nil {
			t.Fatalf("binding the rules for %s: %v", name, err)
		}
		return prepareEveryVerb(t, k, admin, cfg, name)
	}
	all := prepare("rbac-all", rules)
	time.Sleep(300 * time.Millisecond) // the authorizer's role cache
	if err := all(); err != nil {
		t.Fatalf("with the chart's rules: %v", err)
	}
	type without struct {
		what, verb string
		resources  []string
		result     chan error
	}
	var cases []without
	var runs []func() error
	for i, r := range rules {
		for _, verb := range r.Verbs {
			less := make([]rbacv1.PolicyRule, len(rules))
			for j := range rules {
				less[j] = *rules[j].DeepCopy()
			}
			less[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == verb })
			if len(less[i].Verbs) == 0 { // a rule without verbs is invalid: drop it
				less = slices.Delete(less, i, i+1)
			}
			cases = append(cases, without{what: fmt.Sprintf("%s %v", verb, r.Resources), verb: verb, resources: r.Resources, result: make(chan error, 1)})
			runs = append(runs, prepare(fmt.Sprintf("rbac-%d-%s", i, verb), less))
		}
	}
	time.Sleep(300 * time.Millisecond) // the authorizer's role cache
	for i, run := range runs {
		go func() { cases[i].result <- run() }()
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			if err := <-c.result; err == nil {
				t.Errorf("without %q on %v everything still worked: the verb is not needed, remove it from %s", c.verb, c.resources, rulesFile)
			} else {
				t.Logf("without %s: %v", c.what, err)
			}
		})
	}
}

// prepareEveryVerb sets up, as admin, a scenario that uses every verb of
// the chart's rules, and returns the function that runs it with cfg: two
// nodes' cluster parts, node a has no AddressBudget yet (create), node b
// has one without owner (get, update); both publish status; a holds an
// assignment of a pod that does not exist (list for the leak check's live
// list, watch for the cache); a pod gets a NoAddress event twice (create,
// then patch for the series); node a's ENIConfig reader runs. The returned
// function reports what did not happen within a few seconds, or nil; it
// does not touch t, so it may run in its own goroutine.
func prepareEveryVerb(t *testing.T, k *kubetest.Server, admin kubernetes.Interface, cfg *rest.Config, prefix string) func() error {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	suffix := fmt.Sprintf("-%d", time.Now().UnixNano()%1000000)
	a, b := prefix+"-a"+suffix, prefix+"-b"+suffix
	createNode(t, admin, a, 29)
	createNode(t, admin, b, 29)
	budgets := addressbudget.NewClient(dynamic.NewForConfigOrDie(k.Config))
	if _, err := budgets.Create(ctx, &addressbudget.AddressBudget{ObjectMeta: metav1.ObjectMeta{Name: b}}); err != nil {
		t.Fatal(err)
	}
	k.EnsureNamespace(ctx, a)
	pod := createPod(t, admin, a, podSpec{name: "p", node: a})
	applyENIConfigs(t, ctx, k)
	regs := map[string]*prometheus.Registry{a: prometheus.NewRegistry(), b: prometheus.NewRegistry()}
	newPart := func(node string) *cluster.Cluster {
		c, err := cluster.New(cluster.Options{NodeName: node, Config: cfg, Metrics: regs[node], LeakGrace: time.Second,
			PublishInterval: time.Second, CountsInterval: time.Second, Tick: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca, cb := newPart(a), newPart(b)
	eniCfg, err := eniconfig.New(eniconfig.Options{Config: cfg, NodeName: a})
	if err != nil {
		t.Fatal(err)
	}
	budget, err := ec2budget.New(ec2budget.Options{Client: kubernetes.NewForConfigOrDie(cfg), Namespace: a, NodeName: a})
	if err != nil {
		t.Fatal(err)
	}
	return func() error {
		defer cancel()
		go eniCfg.Run(ctx)
		return exerciseEveryVerb(ctx, admin, budgets, a, b, pod, ca, cb, regs, eniCfg, budget)
	}
}

// exerciseEveryVerb runs the scenario prepareEveryVerb set up and returns
// what did not happen within 8 s, or nil; budget is node a's share of the
// fleet's EC2 budget (leases).
func exerciseEveryVerb(ctx context.Context, admin kubernetes.Interface, budgets *addressbudget.Client, a, b string, pod *corev1.Pod,
	ca, cb *cluster.Cluster, regs map[string]*prometheus.Registry, eniCfg *eniconfig.Source, budget *ec2budget.Budget) error {
	var errs []error
	start := func(c *cluster.Cluster, d *fakeDaemon) {
		go c.Run(ctx)
		go d.serve(ctx, c)
	}
	da := newFakeDaemon(m5Snapshot(1))
	da.snap.Held = []nodestatus.Held{{Key: api.Key{Network: "vpcip", ContainerID: "ghost", IfName: "eth0"},
		Pod: api.Pod{Namespace: a, Name: "ghost"}}}
	start(ca, da)
	start(cb, newFakeDaemon(m5Snapshot(2)))
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) && !ca.Health().Connected {
		time.Sleep(100 * time.Millisecond)
	}
	for range 2 {
		ca.NoAddress(api.Pod{Namespace: a, Name: "p", UID: string(pod.UID)}, &api.Error{Code: api.CodeNoAddress, Cause: api.CauseSubnetFull, Message: "no free address: subnet full"})
		time.Sleep(300 * time.Millisecond)
	}
	checks := []struct {
		what string
		ok   func() bool
	}{
		{"leaked ghost assignment released (pods list+watch)", func() bool { return da.releasedCount() == 1 }},
		{"node a's AddressBudget created with status", func() bool {
			ab, err := budgets.Get(ctx, a)
			return err == nil && ab.Status.Addresses.Assigned == 0 && ab.Status.InstanceType == "m5.large"
		}},
		{"node b's AddressBudget adopted (owner) with status", func() bool {
			ab, err := budgets.Get(ctx, b)
			return err == nil && len(ab.OwnerReferences) == 1 && ab.Status.Addresses.Assigned == 2
		}},
		{"node a's ENIConfig read (eniconfigs list+watch)", func() bool {
			c, _, err := eniCfg.NodeENIConfig()
			return err == nil && c.Subnet == "subnet-0000000000000rbac"
		}},
		{"event with a series (create + patch)", func() bool {
			l, err := admin.EventsV1().Events(a).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 1 && l.Items[0].Series != nil
		}},
	}
	// The fleet's shared EC2 budget (ipamd/ec2budget) as node a: two takes
	// create its Lease (get, create) and write it back (update).
	for range 2 {
		budget.Take(ctx, "AttachNetworkInterface", provider.PriorityPodWaiting)
	}
	checks = append(checks, struct {
		what string
		ok   func() bool
	}{"EC2 budget Lease created and taken from twice (leases get, create, update)", func() bool {
		l, err := admin.CoordinationV1().Leases(a).Get(ctx, ec2budget.ShardLeaseName("AttachNetworkInterface", budget.Home(), ec2budget.DefaultShards), metav1.GetOptions{})
		if err != nil {
			return false
		}
		st, err := ec2budget.Decode(l.Annotations[ec2budget.Annotation])
		return err == nil && st.Tokens <= st.Capacity-1.5
	}})
	for _, c := range checks {
		for !c.ok() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if !c.ok() {
			errs = append(errs, errors.New(c.what+": did not happen"))
		}
	}
	if n := eniCfg.APIErrors(); n > 0 {
		errs = append(errs, fmt.Errorf("node a's ENIConfig reader: %d API errors (list or watch)", n))
	}
	for name, reg := range map[string]*prometheus.Registry{"a": regs[a], "b": regs[b]} {
		if n := counter(reg, "vpcip_kubernetes_api_errors_total"); n > 0 {
			errs = append(errs, fmt.Errorf("node %s: %v API errors (watch, list or probe)", name, n))
		}
		if n := counter(reg, "vpcip_kubernetes_writes_total", "outcome", "error"); n > 0 {
			errs = append(errs, fmt.Errorf("node %s: %v failed writes", name, n))
		}
	}
	return errors.Join(errs...)
}

// applyENIConfigs applies the ENIConfig CRD and a "default" ENIConfig as
// admin.
func applyENIConfigs(t *testing.T, ctx context.Context, k *kubetest.Server) {
	t.Helper()
	if err := k.ApplyFiles(ctx, "../../charts/vpcip/crds/eniconfigs.crd.k8s.amazonaws.com.yaml"); err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig",
		"metadata": map[string]any{"name": "default"}, "spec": map[string]any{"subnet": "subnet-0000000000000rbac"}}}
	if err := kubetest.ApplyObjects(ctx, k.Config, obj); err != nil {
		t.Fatal(err)
	}
}
