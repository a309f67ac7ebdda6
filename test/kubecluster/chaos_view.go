package kubecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/ipamd/introspect"
)

// liveSandbox is a workload pod sandbox as the outside sees it: READY in its
// node's CRI, its pause process running, and the IPv4 address on eth0 of its
// network namespace (invalid when eth0 has none).
type liveSandbox struct {
	Node, ID, Pod, UID string
	PID                int
	Addr               netip.Addr
}

func (l liveSandbox) String() string {
	return fmt.Sprintf("%s/%s (sandbox %.12s, pid %d, %v)", l.Node, l.Pod, l.ID, l.PID, l.Addr)
}

// clusterView is one sample of the cluster taken from the outside: each
// node's live sandboxes and their netns addresses (nodes whose CRI did not
// answer are listed in Blind), EC2's view from vpcsim (address -> instance),
// each node's daemon assignments (when its introspection answered), and the
// API server's Running pods (nil when it did not answer).
type clusterView struct {
	At        time.Time
	Sandboxes []liveSandbox
	Blind     []string
	EC2       map[netip.Addr]string
	Daemon    map[string]map[netip.Addr]introspect.Assignment // node -> address -> assignment
	APIPods   []Pod
	// Deleting are the workload pods the API server has marked deleted,
	// with when their grace period ended (metadata.deletionTimestamp).
	Deleting []deletingPod
}

// deletingPod is a pod being deleted: kubelet has not yet confirmed its
// containers and sandbox (and so its CNI DEL) are gone.
type deletingPod struct {
	Name, UID, Node string
	Deadline        time.Time
}

// StuckDeleting is how long past its grace period a deleted pod may stay
// before the campaign counts it as a violation: kubelet keeps a pod until
// its sandbox's CNI DEL succeeds, so a DEL that fails every time leaves
// pods Terminating for good (and their addresses held).
const StuckDeleting = 2 * time.Minute

// viewCluster samples the cluster (see clusterView).
func (ch *Chaos) viewCluster(ctx context.Context) clusterView {
	v := clusterView{At: time.Now(), EC2: map[netip.Addr]string{}, Daemon: map[string]map[netip.Addr]introspect.Assignment{}}
	for _, n := range ch.S.C.Nodes {
		sbs, err := liveSandboxes(ctx, n)
		if err != nil {
			v.Blind = append(v.Blind, n.Name)
			continue
		}
		v.Sandboxes = append(v.Sandboxes, sbs...)
	}
	for _, e := range ch.S.C.Cloud.NetworkInterfaces() {
		for _, a := range e.SecondaryIPs {
			v.EC2[a] = e.InstanceID
		}
		for _, p := range e.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				v.EC2[a] = e.InstanceID
			}
		}
	}
	for _, n := range ch.S.C.Nodes {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := ch.S.daemonState(cctx, n)
		cancel()
		if err != nil {
			continue
		}
		m := map[netip.Addr]introspect.Assignment{}
		for _, a := range st.Assignments {
			m[a.Address] = a
		}
		v.Daemon[n.Name] = m
	}
	if pods, deleting, err := ch.apiPods(ctx); err == nil {
		v.APIPods, v.Deleting = pods, deleting
	}
	return v
}

// liveSandboxes lists n's READY workload sandboxes (not kube-system's, whose
// daemon pods share the node's netns) with their eth0 address.
func liveSandboxes(ctx context.Context, n *Node) ([]liveSandbox, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids, err := n.CRI.PodSandboxIDs(cctx)
	if err != nil {
		return nil, err
	}
	var out []liveSandbox
	for _, id := range ids {
		sb, err := n.CRI.InspectPodSandbox(cctx, id)
		if err != nil || sb.State != "SANDBOX_READY" || sb.PID <= 0 || sb.Pod.Namespace == "kube-system" {
			continue
		}
		l := liveSandbox{Node: n.Name, ID: sb.ID, Pod: sb.Pod.Namespace + "/" + sb.Pod.Name, UID: sb.Pod.UID, PID: sb.PID}
		a, err := eth0Addr(sb.PID)
		if err != nil {
			continue // the pause process went away since CRI answered
		}
		l.Addr = a
		out = append(out, l)
	}
	return out, nil
}

// eth0Addr reads the IPv4 address of eth0 in the network namespace of pid
// (an invalid address when eth0 is missing or has none). The error says the
// process (and so the namespace) is gone.
func eth0Addr(pid int) (netip.Addr, error) {
	h, err := netns.GetFromPid(pid)
	if err != nil {
		return netip.Addr{}, err
	}
	defer h.Close()
	nl, err := netlinksafe.NewHandleAt(h)
	if err != nil {
		return netip.Addr{}, err
	}
	defer nl.Close()
	link, err := nl.LinkByName("eth0")
	if err != nil {
		return netip.Addr{}, nil
	}
	addrs, err := nl.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, nil
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	return a, nil
}

// apiPods lists the workload namespace's pods through client-go (cheaper than
// a kubectl process per sample): those not being deleted, and those being deleted.
func (ch *Chaos) apiPods(ctx context.Context) ([]Pod, []deletingPod, error) {
	cs, err := kubernetes.NewForConfig(ch.S.C.API.Config)
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := cs.CoreV1().Pods("default").List(cctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	var pods []Pod
	var deleting []deletingPod
	for _, it := range l.Items {
		if it.DeletionTimestamp != nil {
			deleting = append(deleting, deletingPod{Name: it.Name, UID: string(it.UID), Node: it.Spec.NodeName, Deadline: it.DeletionTimestamp.Time})
			continue
		}
		pods = append(pods, Pod{Name: it.Name, Namespace: it.Namespace, UID: string(it.UID), Node: it.Spec.NodeName,
			IP: it.Status.PodIP, Phase: string(it.Status.Phase)})
	}
	return pods, deleting, nil
}

// violations checks the invariants on one sample; each violation is keyed
// (the key names what broke, so the same breakage seen again continues one
// violation) and described. checks counts the checks made, by kind.
func (ch *Chaos) violations(v clusterView, checks map[string]int) map[string]string {
	bad := map[string]string{}
	inst := map[string]string{}
	for _, n := range ch.S.C.Nodes {
		inst[n.Name] = n.InstanceID
	}
	// 1. No address on two live pods (netns view, across nodes).
	byAddr := map[netip.Addr][]liveSandbox{}
	for _, s := range v.Sandboxes {
		if s.Addr.IsValid() {
			byAddr[s.Addr] = append(byAddr[s.Addr], s)
		}
	}
	checks["one address, one live pod"] += len(byAddr)
	for a, sbs := range byAddr {
		if len(sbs) > 1 {
			bad["dup "+a.String()] = fmt.Sprintf("address %v on %d live pods: %v", a, len(sbs), sbs)
		}
	}
	// 2. Every live pod has an address, and EC2 assigns it to an ENI of the
	// pod's node; its node's daemon records it for that sandbox.
	for _, s := range v.Sandboxes {
		checks["pod address assigned by EC2 to its node"]++
		switch {
		case !s.Addr.IsValid():
			bad["noaddr "+s.ID] = fmt.Sprintf("live pod %v has no IPv4 address on eth0", s)
		case v.EC2[s.Addr] != inst[s.Node]:
			bad["ec2 "+s.ID] = fmt.Sprintf("live pod %v: EC2 assigns %v to %q, not to %s's %s", s, s.Addr, v.EC2[s.Addr], s.Node, inst[s.Node])
		}
		if d, ok := v.Daemon[s.Node]; ok && s.Addr.IsValid() {
			checks["daemon records the pod's address"]++
			if a, held := d[s.Addr]; !held || a.Key.ContainerID != s.ID {
				bad["daemon "+s.ID] = fmt.Sprintf("live pod %v: %s's daemon records %v for %q (%s)", s, s.Node, s.Addr, a.Key.ContainerID, a.Pod.Name)
			}
		}
	}
	// 3. The API server's Running pods: each address is one EC2 assigns to
	// the pod's node.
	for _, p := range v.APIPods {
		if p.Phase != "Running" || p.IP == "" {
			continue
		}
		checks["Running pod's address assigned by EC2 to its node"]++
		a, err := netip.ParseAddr(p.IP)
		if err != nil || v.EC2[a] != inst[p.Node] {
			bad["api "+p.UID] = fmt.Sprintf("Running pod %s on %s has %s, which EC2 assigns to %q", p.Name, p.Node, p.IP, v.EC2[a])
		}
	}
	// 4. A deleted pod goes within StuckDeleting after its grace period.
	for _, p := range v.Deleting {
		checks["deleted pod gone in time"]++
		if late := v.At.Sub(p.Deadline); late > StuckDeleting {
			bad["stuck "+p.UID] = fmt.Sprintf("pod %s on %s still being deleted %s after its grace period", p.Name, p.Node, late.Round(time.Second))
		}
	}
	return bad
}

// pingSample pings from a random live pod on the first node to one on the
// second and back. A failed ping counts only when both pods are still live
// with the same addresses afterwards (a pod torn down meanwhile is churn).
func (ch *Chaos) pingSample(ctx context.Context, v clusterView, checks map[string]int) map[string]string {
	bad := map[string]string{}
	var a, b []liveSandbox
	for _, s := range v.Sandboxes {
		if !s.Addr.IsValid() {
			continue
		}
		switch s.Node {
		case ch.S.C.Nodes[0].Name:
			a = append(a, s)
		case ch.S.C.Nodes[1].Name:
			b = append(b, s)
		}
	}
	if len(a) == 0 || len(b) == 0 {
		return bad
	}
	ch.rngMu.Lock()
	x, y := a[ch.checkRng.IntN(len(a))], b[ch.checkRng.IntN(len(b))]
	ch.rngMu.Unlock()
	for _, pair := range [][2]liveSandbox{{x, y}, {y, x}} {
		checks["ping across nodes"]++
		from, to := pair[0], pair[1]
		out, err := exec.CommandContext(ctx, "nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", from.PID), "--",
			"ping", "-c", "1", "-W", "2", to.Addr.String()).CombinedOutput()
		if err == nil {
			continue
		}
		if stillLive(from) && stillLive(to) {
			bad["ping "+from.ID+" "+to.ID] = fmt.Sprintf("%v cannot reach %v: %s", from, to, strings.TrimSpace(lastLine(string(out))))
		}
	}
	return bad
}

func stillLive(s liveSandbox) bool {
	a, err := eth0Addr(s.PID)
	return err == nil && a == s.Addr
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

// leftovers lists what a node keeps once every workload pod is gone: daemon
// assignments, host veths, pod routes and rules, and pod network namespaces
// still mounted in the node's /run/netns.
func (ch *Chaos) leftovers(ctx context.Context, n *Node) ([]string, error) {
	var out []string
	st, err := ch.S.daemonState(ctx, n)
	if err != nil {
		return nil, err
	}
	for _, a := range st.Assignments {
		out = append(out, fmt.Sprintf("daemon holds %v for %s (%s)", a.Address, a.Pod.Name, a.Key.ContainerID))
	}
	var links []struct {
		IfName  string `json:"ifname"`
		IfAlias string `json:"ifalias"`
	}
	var routes []struct{ Dst, Dev string }
	var rules []struct {
		Priority int `json:"priority"`
		Src, Dst string
	}
	for _, q := range []struct {
		v    any
		args []string
	}{
		{&links, []string{"link", "show", "type", "veth"}},
		{&routes, []string{"-4", "route", "show", "table", "main", "scope", "link"}},
		{&rules, []string{"-4", "rule", "show"}},
	} {
		s, err := n.InNetns(ctx, "ip", append([]string{"-j"}, q.args...)...)
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(s) != "" {
			if err := json.Unmarshal([]byte(s), q.v); err != nil {
				return nil, fmt.Errorf("ip -j %s on %s: %w", strings.Join(q.args, " "), n.Name, err)
			}
		}
	}
	for _, l := range links {
		if strings.HasPrefix(l.IfName, "eni") {
			out = append(out, fmt.Sprintf("host veth %s (%s)", l.IfName, l.IfAlias))
		}
	}
	for _, r := range routes {
		if _, err := netip.ParseAddr(r.Dst); err == nil && strings.HasPrefix(r.Dev, "eni") {
			out = append(out, fmt.Sprintf("route %s dev %s", r.Dst, r.Dev))
		}
	}
	for _, r := range rules {
		if r.Priority == 512 || r.Priority == 1536 {
			out = append(out, fmt.Sprintf("rule %d from %s to %s", r.Priority, r.Src, r.Dst))
		}
	}
	mounted, err := exec.CommandContext(ctx, "nsenter", "--mount="+n.Mountns, "--", "sh", "-c",
		`for f in /run/netns/cni-*; do [ -e "$f" ] && mountpoint -q "$f" && echo "$f"; done; true`).Output()
	if err != nil {
		return nil, fmt.Errorf("netns of %s: %w", n.Name, err)
	}
	for _, f := range strings.Fields(string(mounted)) {
		out = append(out, "pod netns "+filepath.Base(f))
	}
	slices.Sort(out)
	return out, nil
}
