package cluster_test

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/kubetest"
)

func budget(t *testing.T, k *kubetest.Server, name string) *addressbudget.AddressBudget {
	t.Helper()
	ab, err := addressbudget.NewClient(dynamic.NewForConfigOrDie(k.Config)).Get(context.Background(), name)
	if err != nil {
		return nil
	}
	return ab
}

// The AddressBudget through a real API server: the CRD's schema takes what
// is written, kubectl's columns show it, the Node owns it, an update is
// accepted. The 15 s PublishInterval and the resync are judged on fake time
// (TestStatusWrittenOnChangeOncePerIntervalAndOnResync); here the interval
// is a second so the update comes quickly.
func TestAddressBudgetPublishedAndUpdated(t *testing.T) {
	k := kubetest.Shared(t)
	subnets := func() ([]provider.Subnet, time.Time) {
		whole := 7
		return []provider.Subnet{{ID: "subnet-0a", CIDR: netip.MustParsePrefix("100.64.0.0/16"), FreeAddresses: 4000, FreePrefixes: &whole}}, time.Now()
	}
	e := newEnv(t, k, uniq(t), 29, cluster.Options{Subnets: subnets, PublishInterval: time.Second, CountsInterval: time.Second, Tick: 200 * time.Millisecond})
	e.daemon.set(func(s *nodestatus.Snapshot) { *s = m5Snapshot(9) })
	eventually(t, 20*time.Second, "AddressBudget written", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.InstanceType != "" && b.Status.Addresses.Assigned == 9
	})
	ab := budget(t, k, e.node)
	st := ab.Status
	if err := st.Check(); err != nil {
		t.Errorf("published numbers contradict each other: %v", err)
	}
	if st.Addresses.Assigned != 9 || st.Addresses.Budget != 27 || st.UsedPercent != 33 || st.ENIs.Summary != "2/3" ||
		st.SubnetFree == nil || *st.SubnetFree != 4000 || st.MaxPods.Addresses != 29 || st.MaxPods.Kubelet != 29 || st.Zone != "us-west-2a" {
		t.Errorf("status %+v", st)
	}
	// Each subnet's whole free /28s beside its free addresses (the CRD's
	// schema keeps the field).
	if len(st.Subnets) != 1 || st.Subnets[0].Free != 4000 || st.Subnets[0].FreePrefixes == nil || *st.Subnets[0].FreePrefixes != 7 {
		t.Errorf("subnets %+v, want subnet-0a with 4000 free addresses and 7 free /28s", st.Subnets)
	}
	if len(ab.OwnerReferences) != 1 || ab.OwnerReferences[0].Kind != "Node" || ab.OwnerReferences[0].Name != e.node {
		t.Errorf("owner references %+v, want the Node", ab.OwnerReferences)
	}
	for typ, want := range map[string]metav1.ConditionStatus{
		addressbudget.ConditionReady: metav1.ConditionTrue, addressbudget.ConditionAtENILimit: metav1.ConditionFalse,
		addressbudget.ConditionAddressesLow: metav1.ConditionFalse, addressbudget.ConditionSubnetLow: metav1.ConditionFalse,
		addressbudget.ConditionMaxPodsExceedsAddresses: metav1.ConditionFalse,
	} {
		if c := meta.FindStatusCondition(st.Conditions, typ); c == nil || c.Status != want {
			t.Errorf("condition %s = %+v, want %s", typ, c, want)
		}
	}
	out, err := k.Kubectl(context.Background(), "get", "addressbudgets", e.node)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME TYPE USED BUDGET USED% ENIS SUBNET FREE VERSION AGE" {
		t.Fatalf("kubectl get addressbudgets:\n%s", out)
	}
	if f := strings.Fields(lines[1]); len(f) < 8 || strings.Join(f[:8], " ") != e.node+" m5.large 9 27 33 2/3 4000 test" {
		t.Errorf("row %q, want %s m5.large 9 27 33 2/3 4000 test", lines[1], e.node)
	}

	// A change shows within PublishInterval of the last write.
	changed := time.Now()
	e.daemon.set(func(s *nodestatus.Snapshot) {
		c := &s.Status.Counts
		c.Assigned, c.Warm, c.ENIs, c.Capacity = 20, 7, 3, 27
	})
	eventually(t, 10*time.Second, "change published", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.Addresses.Assigned == 20 && b.Status.ENIs.Summary == "3/3"
	})
	t.Logf("change visible %v after it happened", time.Since(changed).Round(100*time.Millisecond))
	st = budget(t, k, e.node).Status
	if c := meta.FindStatusCondition(st.Conditions, addressbudget.ConditionAtENILimit); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("AtENILimit = %+v at 3/3 ENIs", c)
	}
	if err := st.Check(); err != nil {
		t.Error(err)
	}
}

// TestCountsOnlyChurnWritesOncePerCountsInterval: under churn that moves
// only the pool's counts (assigned, warm, cooling, subnet free addresses
// and whole free /28s) the status
// is written once per CountsInterval, not once per PublishInterval; the
// counts shown are never older than CountsInterval; a change a reader acts
// on (an ENI attached, a condition flipping) is still written within
// PublishInterval.
func TestCountsOnlyChurnWritesOncePerCountsInterval(t *testing.T) {
	k := kubetest.Shared(t)
	const publish, counts = time.Second, 4 * time.Second
	free := 4000
	var freeMu sync.Mutex
	subnets := func() ([]provider.Subnet, time.Time) {
		freeMu.Lock()
		defer freeMu.Unlock()
		whole := free % 5 // other nodes' single addresses break /28s and free them
		return []provider.Subnet{{ID: "subnet-0a", CIDR: netip.MustParsePrefix("100.64.0.0/16"), FreeAddresses: free, FreePrefixes: &whole}}, time.Now()
	}
	e := newEnv(t, k, uniq(t), 29, cluster.Options{Subnets: subnets, PublishInterval: publish, CountsInterval: counts, Tick: 50 * time.Millisecond})
	e.daemon.set(func(s *nodestatus.Snapshot) { *s = m5Snapshot(9) })
	eventually(t, 20*time.Second, "first write", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.Addresses.Assigned == 9
	})
	writes := func() float64 { return counter(e.reg, "vpcip_kubernetes_writes_total", "kind", "addressbudget_status") }
	before := writes()

	// 12 s of churn: the counts move every 50 ms, within what the node
	// already has (2/3 ENIs, capacity 18), and other nodes take subnet addresses.
	const churn = 12 * time.Second
	start := time.Now()
	var lastAssigned int
	for i := 0; time.Since(start) < churn; i++ {
		lastAssigned = 5 + i%8
		e.daemon.set(func(s *nodestatus.Snapshot) {
			s.Status.Assigned, s.Status.Warm, s.Status.Cooling = lastAssigned, 13-lastAssigned, 0
		})
		freeMu.Lock()
		free--
		freeMu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	n := writes() - before
	if want := churn.Seconds() / counts.Seconds(); n < want-1 || n > want+1 {
		t.Errorf("%v status writes in %v of counts-only churn, want one per CountsInterval %v (%v ± 1); PublishInterval is %v", n, churn, counts, want, publish)
	}
	// The counts shown catch up within CountsInterval.
	eventually(t, counts+2*time.Second, "last counts shown", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.Addresses.Assigned == lastAssigned
	})

	// An ENI attached (capacity and the ENI count change): within PublishInterval.
	time.Sleep(publish) // past PublishInterval since the write above
	changed := time.Now()
	e.daemon.set(func(s *nodestatus.Snapshot) { s.Status.ENIs, s.Status.Capacity = 3, 27 })
	eventually(t, publish+2*time.Second, "ENI attach shown", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.ENIs.Summary == "3/3"
	})
	if d := time.Since(changed); d > publish+time.Second {
		t.Errorf("an attached ENI shown %v after it happened, want within PublishInterval %v", d, publish)
	}
}

// TestChangesReadersActOnCountAgainstTheCountsInterval: while the counts
// churn, an ENI attached or detached every 1.25 CountsIntervals (a change a
// reader acts on, written within PublishInterval) takes the place of a
// counts-only write: status writes stay at about one per CountsInterval
// instead of one per change plus one per interval.
func TestChangesReadersActOnCountAgainstTheCountsInterval(t *testing.T) {
	k := kubetest.Shared(t)
	const publish, counts = 500 * time.Millisecond, 2 * time.Second
	e := newEnv(t, k, uniq(t), 29, cluster.Options{PublishInterval: publish, CountsInterval: counts, Tick: 50 * time.Millisecond})
	e.daemon.set(func(s *nodestatus.Snapshot) { *s = m5Snapshot(9) })
	eventually(t, 20*time.Second, "first write", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.Addresses.Assigned == 9
	})
	writes := func() float64 { return counter(e.reg, "vpcip_kubernetes_writes_total", "kind", "addressbudget_status") }
	before := writes()
	const churn, eniEvery = 20 * time.Second, 5 * counts / 4
	start := time.Now()
	lastENI := start
	enis := 2
	var lastAssigned int
	for i := 0; time.Since(start) < churn; i++ {
		if time.Since(lastENI) >= eniEvery {
			enis, lastENI = 5-enis, time.Now() // 2 ↔ 3
		}
		lastAssigned = 5 + i%8
		e.daemon.set(func(s *nodestatus.Snapshot) {
			s.Status.ENIs, s.Status.Capacity = enis, 9*enis
			s.Status.Assigned, s.Status.Warm, s.Status.Cooling = lastAssigned, 9*enis-lastAssigned, 0
		})
		time.Sleep(50 * time.Millisecond)
	}
	n := writes() - before
	if most := churn.Seconds()/counts.Seconds() + 2; n > most {
		t.Errorf("%v status writes in %v of counts churn with an ENI change every %v: want at most %v (one per CountsInterval %v, plus two)", n, churn, eniEvery, most, counts)
	}
	// The counts still catch up, within two CountsIntervals.
	eventually(t, 2*counts+2*time.Second, "last counts shown", func() bool {
		b := budget(t, k, e.node)
		return b != nil && b.Status.Addresses.Assigned == lastAssigned
	})
}

func TestMaxPodsAboveAddressesRaisesConditionAndNodeEvent(t *testing.T) {
	k := kubetest.Shared(t)
	// kubelet's default 110 on an m5.large, whose addresses serve 29.
	e := newEnv(t, k, uniq(t), 110, cluster.Options{})
	eventually(t, 20*time.Second, "condition published", func() bool {
		b := budget(t, k, e.node)
		if b == nil {
			return false
		}
		c := meta.FindStatusCondition(b.Status.Conditions, addressbudget.ConditionMaxPodsExceedsAddresses)
		return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "max-pods 110") && strings.Contains(c.Message, "29 pods")
	})
	eventually(t, 10*time.Second, "Node event", func() bool {
		l, err := e.admin.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range l.Items {
			if ev.Regarding.Kind == "Node" && ev.Regarding.Name == e.node && ev.Reason == cluster.ReasonMaxPodsExceedsAddresses {
				return strings.Contains(ev.Note, "ContainerCreating") && strings.Contains(ev.Note, "110")
			}
		}
		return false
	})
}
