package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// publish writes AddressBudgets to a real kube-apiserver as the daemons do:
// create, then the status subresource.
func publish(t *testing.T, k *kubetest.Server, budgets []addressbudget.AddressBudget) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := k.ApplyFiles(ctx, filepath.Join("..", "..", "charts", "vpcip", "crds", "addressbudgets.vpcip.io.yaml")); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := addressbudget.NewClient(dyn)
	for _, ab := range budgets {
		created, err := c.Create(ctx, &ab)
		if err != nil {
			t.Fatal(err)
		}
		created.Status = ab.Status
		if _, err := c.UpdateStatus(ctx, created); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCapacityClusterAgainstAPIServer: `vpcipctl capacity --cluster` reads
// the AddressBudgets through a kubeconfig from a real kube-apiserver, and
// the same binary installed as kubectl-vpcip answers `kubectl vpcip
// capacity`.
func TestCapacityClusterAgainstAPIServer(t *testing.T) {
	k := kubetest.Shared(t)
	publish(t, k, testFleet())

	stdout, stderr, code := runCtl(t, "capacity", "--cluster", "--kubeconfig", k.Kubeconfig, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var f fleet
	if err := json.Unmarshal([]byte(stdout), &f); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	if len(f.Nodes) != 3 || f.Nodes[0].Name != "node-full" || f.Nodes[2].Name != "node-roomy" {
		t.Errorf("nodes %+v, want node-full first and node-roomy last", f.Nodes)
	}
	if f.Total.Used != 40 || f.Total.Budget != 74 || len(f.Zones) != 2 || len(f.Subnets) != 2 || f.Subnets[0].Free != 30 {
		t.Errorf("totals %+v zones %+v subnets %+v", f.Total, f.Zones, f.Subnets)
	}

	t.Setenv("KUBECONFIG", k.Kubeconfig) // as an operator's shell has it
	stdout, stderr, code = runCtl(t, "capacity", "--cluster")
	if code != 0 || !strings.Contains(stdout, "node-full   us-west-2a  m5.large  27/27        0         [####################]  100%") {
		t.Errorf("table through $KUBECONFIG, exit %d %s:\n%s", code, stderr, stdout)
	}

	plugins := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(plugins, "kubectl-vpcip"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	kubectl := exec.Command(filepath.Join(k.BinDir, "kubectl"), "vpcip", "capacity", "-o", "yaml")
	kubectl.Env = append(os.Environ(), "PATH="+plugins+":"+os.Getenv("PATH"), "KUBECONFIG="+k.Kubeconfig)
	var out, errb bytes.Buffer
	kubectl.Stdout, kubectl.Stderr = &out, &errb
	if err := kubectl.Run(); err != nil {
		t.Fatalf("kubectl vpcip capacity: %v\n%s", err, errb.String())
	}
	if first := strings.Index(out.String(), "name: node-full"); first < 0 || first > strings.Index(out.String(), "name: node-roomy") {
		t.Errorf("kubectl vpcip capacity -o yaml:\n%s", out.String())
	}
}

// TestCapacityClusterErrors: a bad kubeconfig or format is a clear error.
func TestCapacityClusterErrors(t *testing.T) {
	_, stderr, code := runCtl(t, "capacity", "--cluster", "--kubeconfig", filepath.Join(t.TempDir(), "missing"))
	if code != exitFail || !strings.Contains(stderr, "kubeconfig") {
		t.Errorf("missing kubeconfig: exit %d, %q", code, stderr)
	}
	_, stderr, code = runCtl(t, "capacity", "--cluster", "-o", "xml")
	if code != exitUsage || !strings.Contains(stderr, "table, json or yaml") {
		t.Errorf("-o xml: exit %d, %q", code, stderr)
	}
	if got := pluginArgs([]string{"capacity", "-o", "json"}); strings.Join(got, " ") != "capacity --cluster -o json" {
		t.Errorf("pluginArgs = %v", got)
	}
}
