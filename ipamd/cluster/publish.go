package cluster

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
)

// HostNetworkAllowance is addressbudget.HostNetworkAllowance: the
// host-network pods the EKS max-pods formula adds to the address count.
const HostNetworkAllowance = addressbudget.HostNetworkAllowance

// publisher renders the daemon's status into the node's AddressBudget and
// writes it (Cluster.step, every tick). It works on its Cluster's informers
// and, under the Cluster's lock, on its publishState.
type publisher struct{ c *Cluster }

// publishState is what the publisher last wrote.
type publishState struct {
	obj       *addressbudget.AddressBudget // as the API server returned it; nil: read it again
	last      addressbudget.Status         // last status written
	lastWrite time.Time
	// credit is countsCredit's balance at creditAt: counts-only writes a
	// node may make now (see countsCredit).
	credit    float64
	creditAt  time.Time
	err       string // last write error, for Health
	maxPodsOn bool   // MaxPodsExceedsAddresses was True at the last look
}

// node returns this node from the cache, or nil.
func (c *Cluster) node() *corev1.Node {
	obj, ok, err := c.nodes.GetStore().GetByKey(c.o.NodeName)
	if err != nil || !ok {
		return nil
	}
	return obj.(*corev1.Node)
}

// hostNetworkPods counts cached non-terminal host-network pods.
func (pb publisher) hostNetworkPods() int {
	c := pb.c
	n := 0
	for _, obj := range c.pods.GetStore().List() {
		p := obj.(*corev1.Pod)
		if p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			n++
		}
	}
	return n
}

// buildStatus turns the daemon's snapshot and the Node into the published
// status; conditions keep their transition times from prev. The pool's
// numbers come from the snapshot's api.Counts through
// addressbudget.Status.SetCounts, as every other rendering of them.
func (pb publisher) buildStatus(s nodestatus.Snapshot, node *corev1.Node, prev []metav1.Condition, now time.Time) addressbudget.Status {
	st := addressbudget.Status{
		InstanceType: s.Instance.Type, InstanceID: s.Instance.ID, Zone: s.Instance.AvailabilityZone, PrefixMode: s.PrefixMode,
		Subnets: pb.subnets(), Version: s.Version, CheckpointSchema: s.CheckpointSchema, PodSubnet: podSubnet(s.Placement),
	}
	st.SetCounts(s.Status.Counts)
	if len(st.Subnets) > 0 {
		free := 0
		for _, sn := range st.Subnets {
			free += sn.Free
		}
		st.SubnetFree = &free
	}
	if st.Zone == "" && node != nil {
		st.Zone = node.Labels[corev1.LabelTopologyZone]
	}
	if node != nil {
		if q, ok := node.Status.Capacity[corev1.ResourcePods]; ok {
			st.MaxPods.Kubelet = int(q.Value())
		}
	}
	conds := append([]metav1.Condition(nil), prev...)
	for _, cond := range pb.conditions(s, st) {
		cond.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
		meta.SetStatusCondition(&conds, cond)
	}
	st.Conditions = conds
	return st
}

// subnets are the node's subnets with their free addresses and whole free
// /28s, by ID (nil before the first DescribeSubnets).
func (pb publisher) subnets() []addressbudget.Subnet {
	c := pb.c
	if c.o.Subnets == nil {
		return nil
	}
	latest, _ := c.o.Subnets()
	var out []addressbudget.Subnet
	for _, sn := range latest {
		out = append(out, addressbudget.Subnet{ID: sn.ID, CIDR: sn.CIDR.String(), Free: sn.FreeAddresses, FreePrefixes: sn.FreePrefixes})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// podSubnet is the latest ENI placement as published; nil before the first.
func podSubnet(pl podsubnet.Decision) *addressbudget.PodSubnet {
	if pl.Mode == "" {
		return nil
	}
	p := &addressbudget.PodSubnet{Mode: pl.Mode, ENIConfig: pl.ENIConfig, Reason: pl.Reason, Problem: pl.Problem, Cause: pl.Cause}
	if len(pl.Targets) > 0 {
		p.Subnet, p.SecurityGroups = pl.Targets[0].SubnetID, pl.Targets[0].SecurityGroups
	}
	return p
}

// conditions derives the status conditions; rules in the comments.
func (pb publisher) conditions(snap nodestatus.Snapshot, st addressbudget.Status) []metav1.Condition {
	s := snap.Status.Counts
	cond := func(typ string, on bool, reasonOn, reasonOff, msg string) metav1.Condition {
		r, v := reasonOff, metav1.ConditionFalse
		if on {
			r, v = reasonOn, metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: v, Reason: r, Message: msg}
	}
	free := s.Budget - s.Assigned
	// Low: at most a tenth of the budget (at least 2) left to assign.
	low := s.Budget > 0 && free <= max(2, s.Budget/10)
	// Subnet low: the node's subnets hold less than one ENI's worth (at least 16).
	perENI := 0
	if s.MaxENIs > 0 {
		perENI = s.Budget / s.MaxENIs
	}
	subnetLow := st.SubnetFree != nil && *st.SubnetFree < max(16, perENI)
	// Max pods: kubelet admits more pods than the addresses serve plus the
	// host-network pods (at least the formula's 2).
	serve := s.Budget + max(HostNetworkAllowance, pb.hostNetworkPods())
	exceeds := st.MaxPods.Kubelet > 0 && st.MaxPods.Kubelet > serve
	out := []metav1.Condition{
		cond(addressbudget.ConditionReady, snap.Status.Ready, "DaemonReady", "DaemonNotReady", ""),
		cond(addressbudget.ConditionAddressesLow, low, "FewAddressesLeft", "AddressesAvailable",
			fmt.Sprintf("%d of %d addresses assigned, %d left", s.Assigned, s.Budget, free)),
		cond(addressbudget.ConditionAtENILimit, s.MaxENIs > 0 && s.ENIs >= s.MaxENIs, "AllENIsAttached", "ENIsAvailable",
			fmt.Sprintf("%d/%d ENIs attached", s.ENIs, s.MaxENIs)),
		cond(addressbudget.ConditionSubnetLow, subnetLow, "SubnetNearlyFull", "SubnetHasAddresses", subnetNote(st.SubnetFree)),
		cond(addressbudget.ConditionMaxPodsExceedsAddresses, exceeds, "KubeletMaxPodsTooHigh", "KubeletMaxPodsServed",
			maxPodsNote(st.MaxPods.Kubelet, serve, s)),
	}
	// Pod subnet: once the daemon placed (or failed to place) an ENI.
	if p := st.PodSubnet; p != nil {
		c := cond(addressbudget.ConditionPodSubnetReady, p.Problem == "", "ENIPlaced", p.Cause, p.Reason)
		if p.Problem != "" {
			c.Message = p.Problem
		}
		out = append(out, c)
	}
	// Sandbox netns: once the daemon looked (never without a host view).
	if w := snap.SandboxNetns; w != nil {
		msg := "sandbox netns seen in " + strings.Join(w.Dirs, ", ")
		if !w.Visible {
			msg = w.Reason
		}
		out = append(out, cond(addressbudget.ConditionSandboxNetnsVisible, w.Visible, "NetnsDirectoryMounted", "NetnsNotVisible", msg))
	}
	return out
}

func maxPodsNote(kubelet, serve int, s api.Counts) string {
	return fmt.Sprintf("kubelet max-pods %d, the node's addresses serve %d pods (%d addresses at %d ENIs + %d host-network pods)",
		kubelet, serve, s.Budget, s.MaxENIs, serve-s.Budget)
}

// shownEqual compares two statuses ignoring condition transition times.
func shownEqual(a, b addressbudget.Status) bool {
	strip := func(s addressbudget.Status) addressbudget.Status {
		s.Conditions = append([]metav1.Condition(nil), s.Conditions...)
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return s
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// countsOnly is s without what moves with every pod and every other node's
// allocation: the pool's assigned, warm and cooling counts, the used
// percent, the subnets' free addresses and whole free /28s, and the
// condition messages that quote them (a condition's status and reason
// stay).
func countsOnly(s addressbudget.Status) addressbudget.Status {
	s.Addresses.Assigned, s.Addresses.Warm, s.Addresses.Cooling, s.UsedPercent = 0, 0, 0, 0
	s.Subnets = append([]addressbudget.Subnet(nil), s.Subnets...)
	for i := range s.Subnets {
		s.Subnets[i].Free, s.Subnets[i].FreePrefixes = 0, nil
	}
	s.SubnetFree = nil
	s.Conditions = append([]metav1.Condition(nil), s.Conditions...)
	for i := range s.Conditions {
		s.Conditions[i].Message = ""
	}
	return s
}

// countsCredit is the balance, at now, that paces counts-only writes: one
// write's worth earned per interval up to one, every status write (of any
// kind) costs one, down to minus one. A counts-only write needs a whole
// one: at least interval after the last write, and after a change a reader
// acts on was written less than interval after the write before it, up to
// twice interval (that write showed the counts of its time). So counts-only
// writes and those changes together stay at one per interval while the
// changes are rarer than that. Never written: one.
func (p publishState) countsCredit(now time.Time, interval time.Duration) float64 {
	if p.creditAt.IsZero() {
		return 1
	}
	return min(1, p.credit+float64(now.Sub(p.creditAt))/float64(interval))
}

// publish writes the AddressBudget status when it changed: after
// PublishInterval since the last write for a change a reader acts on, when
// countsCredit allows one (about CountsInterval) when only the counts moved
// (countsOnly), and after ResyncInterval anyway. It needs the Node (owner reference), so it waits
// for the node cache.
func (pb publisher) publish(ctx context.Context, snap nodestatus.Snapshot) {
	c := pb.c
	if !c.nodes.HasSynced() {
		return
	}
	node := c.node()
	if node == nil {
		return
	}
	now := c.o.Now()
	c.mu.Lock()
	prev := c.pub
	c.mu.Unlock()
	st := pb.buildStatus(snap, node, prev.last.Conditions, now)
	pb.noticeMaxPods(node, st)
	since := now.Sub(prev.lastWrite)
	credit := prev.countsCredit(now, c.o.CountsInterval)
	due := prev.lastWrite.IsZero() || since >= c.o.ResyncInterval ||
		(since >= c.o.PublishInterval && !shownEqual(countsOnly(st), countsOnly(prev.last))) ||
		(credit >= 1 && !shownEqual(st, prev.last))
	if !due {
		return
	}
	obj, err := pb.write(ctx, prev.obj, node, st)
	var status apierrors.APIStatus
	if err != nil && !errors.As(err, &status) {
		// No answer from the API server (connection reset, timeout): the
		// part is degraded until a probe succeeds, as after a failed watch
		// (a watch through a proxy whose backend died may hang instead of
		// failing). Deferred: it runs after c.mu is released below.
		defer c.apiError("write AddressBudget", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pub.lastWrite = now // also on failure: retry after PublishInterval, not every tick
	c.pub.credit, c.pub.creditAt = max(credit-1, -1), now
	if err != nil {
		c.pub.obj, c.pub.err = nil, "AddressBudget not written: "+err.Error()
		c.log.Warn("AddressBudget write failed", "node", c.o.NodeName, "err", err)
		return
	}
	c.pub.obj, c.pub.last, c.pub.err = obj, st, ""
}

// write makes sure the object exists and is owned by node, then writes its
// status. obj is the last known object, nil to read it.
func (pb publisher) write(ctx context.Context, obj *addressbudget.AddressBudget, node *corev1.Node, st addressbudget.Status) (*addressbudget.AddressBudget, error) {
	c := pb.c
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	var err error
	if obj == nil {
		obj, err = c.api.budgets.Get(ctx, c.o.NodeName)
		if apierrors.IsNotFound(err) {
			obj, err = c.api.budgets.Create(ctx, &addressbudget.AddressBudget{ObjectMeta: metav1.ObjectMeta{Name: c.o.NodeName, OwnerReferences: []metav1.OwnerReference{owner}}})
			pb.countWrite("addressbudget_create", err)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(obj.OwnerReferences) != 1 || obj.OwnerReferences[0].UID != node.UID {
		obj.OwnerReferences = []metav1.OwnerReference{owner}
		obj, err = c.api.budgets.Update(ctx, obj)
		pb.countWrite("addressbudget_update", err)
		if err != nil {
			return nil, err
		}
	}
	obj.Status = st
	obj, err = c.api.budgets.UpdateStatus(ctx, obj)
	pb.countWrite("addressbudget_status", err)
	return obj, err
}

func (pb publisher) countWrite(kind string, err error) {
	c := pb.c
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.metrics.writes.WithLabelValues(kind, outcome).Inc()
}

// noticeMaxPods emits a Warning Event on the Node when kubelet's max-pods
// rises above what the addresses serve (field failure K05), once per
// transition, and logs it.
func (pb publisher) noticeMaxPods(node *corev1.Node, st addressbudget.Status) {
	c := pb.c
	cond := meta.FindStatusCondition(st.Conditions, addressbudget.ConditionMaxPodsExceedsAddresses)
	on := cond != nil && cond.Status == metav1.ConditionTrue
	c.mu.Lock()
	was := c.pub.maxPodsOn
	c.pub.maxPodsOn = on
	c.mu.Unlock()
	if on && !was {
		msg := "pods scheduled here beyond the address limit will stay in ContainerCreating: " + cond.Message
		c.log.Warn("kubelet max-pods above the node's address capacity", "node", c.o.NodeName, "detail", cond.Message)
		c.nodeEvent(node, corev1.EventTypeWarning, ReasonMaxPodsExceedsAddresses, msg)
	}
}

func subnetNote(free *int) string {
	if free == nil {
		return "subnets not read yet"
	}
	return fmt.Sprintf("%d free addresses in the node's subnets", *free)
}
