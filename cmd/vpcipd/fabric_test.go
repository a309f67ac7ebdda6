package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestDaemonInFabricNode runs the vpcipd binary inside a vpcsim fabric node
// netns with host networking on (root only): it finds EC2 and IMDS at the
// VPC's addresses, sets up the secondary ENI it creates (route table, rule)
// and the SNAT chain, and serves an address that the cloud routes to the node.
func TestDaemonInFabricNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	bin := buildDaemon(t)
	prefix := fmt.Sprintf("vd%04x", rand.IntN(0x10000))
	f := vpcsimtest.StartFabric(t, vpcsim.Config{Seed: 11}, prefix)
	inst := f.Launch(t, "m5.large")
	ns := f.Fabric.NodeNetns(inst.ID)
	dir := shortDir(t)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		"AWS_REGION=us-west-2", "AWS_ACCESS_KEY_ID=AKIDVPCIPTEST", "AWS_SECRET_ACCESS_KEY=secret",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_ENDPOINT_URL_EC2=" + f.EC2URL, "AWS_EC2_METADATA_SERVICE_ENDPOINT=" + f.IMDSURL,
		"VPCIP_SOCKET=" + filepath.Join(dir, "s.sock"), "VPCIP_CHECKPOINT=" + filepath.Join(dir, "ipam.json"),
		"VPCIP_METRICS_ADDR=off", "VPCIP_INTROSPECTION_ADDR=127.0.0.1:61679",
		"VPCIP_CLUSTER_NAME=fabric-test", "WARM_IP_TARGET=12",
	}
	cmd, client := startInNode(t, bin, ns, env, dir)
	var secondary vpcsim.ENIInfo
	for _, e := range f.Cloud.NetworkInterfaces() {
		if e.InstanceID == inst.ID && e.DeviceIndex == 1 {
			secondary = e
		}
	}
	if secondary.ID == "" {
		t.Fatal("the daemon created no secondary ENI for WARM_IP_TARGET=12")
	}
	inNode := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if got := inNode("ip", "route", "show", "table", "2"); !strings.Contains(got, "default via "+secondary.Gateway.String()) {
		t.Errorf("table 2 of the node:\n%s\nwant a default route via %s", got, secondary.Gateway)
	}
	if got := inNode("ip", "rule"); !strings.Contains(got, "from "+secondary.PrimaryIP.String()+" lookup 2") {
		t.Errorf("rules of the node:\n%s\nwant one from %s to table 2", got, secondary.PrimaryIP)
	}
	if got := inNode("iptables", "-t", "nat", "-S"); !strings.Contains(got, "-N VPCIP-SNAT") {
		t.Errorf("nat table of the node lacks VPCIP-SNAT:\n%s", got)
	}
	a, err := client.Assign(context.Background(), api.AssignRequest{Key: key("c1"), Pod: api.Pod{Namespace: "default", Name: "p1"}})
	if err != nil {
		t.Fatal(err)
	}
	onNode := false
	for _, e := range f.Cloud.NetworkInterfaces() {
		for _, s := range e.SecondaryIPs {
			onNode = onNode || (s == a.Address && e.InstanceID == inst.ID && e.ID == a.ENIID)
		}
	}
	if !onNode {
		t.Errorf("assigned %s is not a secondary address of %s on the node", a.Address, a.ENIID)
	}
	if got := inNode("curl", "-s", "http://127.0.0.1:61679/v1/pool"); !strings.Contains(got, `"assigned": 1`) {
		t.Errorf("introspection /v1/pool inside the node: %s", got)
	}
	// A pod the runtime wired (veth and host route), then a checkpoint
	// lost to corruption: the restarted daemon holds the pod's address from
	// the node's routes, and frees it once the pod's route is gone.
	inNode("ip", "link", "add", "enipod0000001", "type", "veth", "peer", "name", prefix+"p1")
	inNode("ip", "link", "set", "enipod0000001", "up")
	inNode("ip", "route", "add", a.Address.String()+"/32", "dev", "enipod0000001", "scope", "link")
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("vpcipd after SIGTERM: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ipam.json"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, client = startInNode(t, bin, ns, append(env, "VPCIP_RECONCILE_INTERVAL=100ms", "VPCIP_GC_GRACE=10s"), dir)
	if st, _ := client.Status(context.Background()); st.Assigned != 1 {
		t.Errorf("after the corrupt checkpoint %d addresses held, want the wired pod's", st.Assigned)
	}
	b, err := client.Assign(context.Background(), api.AssignRequest{Key: key("c2"), Pod: api.Pod{Namespace: "default", Name: "p2"}})
	if err != nil || b.Address == a.Address {
		t.Fatalf("ADD(c2) after the corrupt checkpoint = %v, %v; must not be the live pod's %s", b.Address, err, a.Address)
	}
	inNode("ip", "link", "add", "enipod0000002", "type", "veth", "peer", "name", prefix+"p2")
	inNode("ip", "link", "set", "enipod0000002", "up")
	inNode("ip", "route", "add", b.Address.String()+"/32", "dev", "enipod0000002", "scope", "link")
	inNode("ip", "link", "del", "enipod0000001")
	deadline := time.Now().Add(30 * time.Second) // released past VPCIP_GC_GRACE (10 s) from its recovery
	for {
		st, err := client.Status(context.Background())
		if err == nil && st.Assigned == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gone pod's address is still held: %+v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, err := client.Check(context.Background(), api.CheckRequest{Key: key("c2")}); err != nil || got.Address != b.Address {
		t.Errorf("c2 after the sweep: %v %v", got.Address, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("vpcipd after SIGTERM: %v", err)
	}
}

// startInNode runs vpcipd in the node netns and waits until it is ready
// with a warm pool; the process is killed when the test ends.
func startInNode(t *testing.T, bin, ns string, env []string, dir string) (*exec.Cmd, *api.Client) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, bin)
	cmd.Env = env
	logf, err := os.OpenFile(filepath.Join(dir, "vpcipd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	client := api.NewClient(filepath.Join(dir, "s.sock"), 5*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := client.Status(context.Background())
		if err == nil && st.Ready && st.Warm >= 12 {
			return cmd, client
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "vpcipd.log"))
			t.Fatalf("vpcipd not ready in the fabric: %v %+v\n%s", err, st, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
