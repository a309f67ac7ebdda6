package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// capNames are the capability bits of /proc/<pid>/status CapEff this test
// names (linux/capability.h).
var capNames = map[int]string{0: "CHOWN", 1: "DAC_OVERRIDE", 2: "DAC_READ_SEARCH", 3: "FOWNER", 5: "KILL", 6: "SETGID", 7: "SETUID",
	10: "NET_BIND_SERVICE", 12: "NET_ADMIN", 13: "NET_RAW", 19: "SYS_PTRACE", 21: "SYS_ADMIN", 27: "MKNOD", 29: "AUDIT_WRITE", 31: "SETFCAP"}

// effectiveCaps reads a process's effective capability set.
func effectiveCaps(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return nil, err
			}
			var out []string
			for bit := 0; bit < 64; bit++ {
				if mask&(1<<bit) != 0 {
					name := capNames[bit]
					if name == "" {
						name = "bit" + strconv.Itoa(bit)
					}
					out = append(out, name)
				}
			}
			return out, nil
		}
	}
	return nil, errors.New("no CapEff line")
}

// containerProcesses finds the processes whose command line starts with
// argv0 and that run in another mount namespace than the test (a
// container's; /proc/<pid>/root reads "/" from outside it, so it cannot
// tell).
func containerProcesses(argv0 string) (map[int]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmd), argv0+"\x00") {
			continue
		}
		if mnt, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err != nil || mnt == self {
			continue
		}
		out[pid] = strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")
	}
	return out, nil
}

// TestClusterSecurity: the chart installed on the real cluster (kubelet,
// containerd) with VPCIP_IMDS_ALLOW_NAMESPACES=trusted. The daemon runs
// unprivileged with exactly NET_ADMIN and NET_RAW effective (read from the
// running process), install-cni with none; both daemons publish their own
// AddressBudget under the chart's admission policies; a pod in default
// cannot get an IMDS token (connection refused), a pod in trusted can, and
// so can the node; pods still reach each other across nodes.
func TestClusterSecurity(t *testing.T) {
	image, vpcipctl, h := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "vs", image)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("env:\n  VPCIP_IMDS_ALLOW_NAMESPACES: trusted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Values: values, Logf: t.Logf,
		WantConfig: map[string]string{"VPCIP_IMDS_ALLOW_NAMESPACES": "trusted", "VPCIP_IMDS_POD_ACCESS": "blocked", "VPCIP_SYSCTL_NET_DIR": "/host/proc/sys/net"}}
	if err := s.install(ctx); err != nil {
		logs, _ := c.Kubectl(ctx, "logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=vpcip", "-c", "vpcipd", "--tail=40", "--prefix")
		t.Fatalf("%v\nvpcipd logs:\n%s", err, logs)
	}

	procs, err := containerProcesses("/usr/local/bin/vpcipd")
	if err != nil {
		t.Fatal(err)
	}
	daemons := 0
	for pid, cmd := range procs {
		caps, err := effectiveCaps(pid)
		if err != nil {
			continue // gone meanwhile
		}
		want := "NET_ADMIN,NET_RAW"
		if strings.Contains(cmd, "install-cni") {
			want = ""
		} else {
			daemons++
		}
		t.Logf("pid %d %q: effective capabilities %v", pid, cmd, caps)
		if got := strings.Join(caps, ","); got != want {
			t.Errorf("pid %d %q: effective capabilities %q, want %q", pid, cmd, got, want)
		}
	}
	if daemons != len(c.Nodes) {
		t.Errorf("found %d vpcipd daemon processes in containers, want %d", daemons, len(c.Nodes))
	}
	if out, err := c.Kubectl(ctx, "get", "validatingadmissionpolicies", "-o", "name"); err != nil || !strings.Contains(out, "vpcip-addressbudget-own-node") {
		t.Errorf("admission policies installed: %q, %v", out, err)
	}
	for _, n := range c.Nodes {
		var budget string
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(2 * time.Second) {
			budget, _ = c.Kubectl(ctx, "get", "addressbudget", n.Name, "-o", "jsonpath={.status.addresses.budget}")
			if b, _ := strconv.Atoi(strings.TrimSpace(budget)); b > 0 {
				break
			}
		}
		if b, _ := strconv.Atoi(strings.TrimSpace(budget)); b <= 0 {
			t.Errorf("%s: AddressBudget status not written by its daemon (budget %q)", n.Name, budget)
		}
	}

	pause, err := s.pauseImage()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl(ctx, "create", "namespace", "trusted"); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"default", "trusted"} {
		m := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: imds, namespace: %s}
spec:
  replicas: 2
  selector: {matchLabels: {app: imds}}
  template:
    metadata: {labels: {app: imds}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: imds}}}
      containers:
        - {name: pause, image: %q, imagePullPolicy: Never}
`, ns, pause)
		if err := c.Apply(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	pods := map[string][]Pod{}
	for _, ns := range []string{"default", "trusted"} {
		if pods[ns], err = c.WaitPods(ctx, ns, "app=imds", 3*time.Minute, ns+" pods Running", AllRunning(2)); err != nil {
			t.Fatal(err)
		}
	}
	for ns, list := range pods {
		for _, p := range list {
			pid, err := s.podPID(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = fabric.IMDSToken(ctx, fmt.Sprintf("/proc/%d/ns/net", pid))
			t.Logf("%s/%s (%s on %s) -> IMDS: %v after %v", ns, p.Name, p.IP, p.Node, err, time.Since(start).Round(time.Millisecond))
			switch {
			case ns == "trusted" && err != nil:
				t.Errorf("%s/%s: %v, want an IMDS token", ns, p.Name, err)
			case ns == "default" && !errors.Is(err, syscall.ECONNREFUSED):
				t.Errorf("%s/%s: %v, want connection refused", ns, p.Name, err)
			}
		}
	}
	for _, n := range c.Nodes {
		if err := fabric.IMDSToken(ctx, filepath.Join("/var/run/netns", n.Netns)); err != nil {
			t.Errorf("%s itself -> IMDS: %v, want a token", n.Name, err)
		}
	}
	d, tr := pods["default"], pods["trusted"]
	for _, pair := range [][2]Pod{{d[0], d[1]}, {d[0], tr[0]}, {tr[0], d[1]}, {tr[1], d[0]}} {
		if pair[0].Node == pair[1].Node {
			continue
		}
		if err := s.ping(ctx, pair[0], pair[1].IP); err != nil {
			t.Error(err)
		}
	}

	for _, ns := range []string{"default", "trusted"} {
		if _, err := c.Kubectl(ctx, "delete", "deployment", "imds", "-n", ns, "--wait=true", "--timeout=2m"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitPods(ctx, ns, "app=imds", 2*time.Minute, ns+" pods gone", func(p []Pod) bool { return len(p) == 0 }); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		out, err := n.InNetns(ctx, "iptables", "-w", "-S", "VPCIP-IMDS")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tr {
			if strings.Contains(out, p.IP+"/32") {
				t.Errorf("%s: VPCIP-IMDS still allows %s after its pod was deleted:\n%s", n.Name, p.IP, out)
			}
		}
	}
	if out, err := c.Helm(h, "uninstall", Release, "-n", "kube-system", "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm uninstall: %v: %s", err, out)
	}
}
