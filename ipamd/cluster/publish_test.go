package cluster_test

import (
	"context"
	"net/netip"
	"strings"
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
		return []provider.Subnet{{ID: "subnet-0a", CIDR: netip.MustParsePrefix("100.64.0.0/16"), FreeAddresses: 4000}}, time.Now()
	}
	e := newEnv(t, k, uniq(t), 29, cluster.Options{Subnets: subnets, PublishInterval: time.Second, Tick: 200 * time.Millisecond})
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
