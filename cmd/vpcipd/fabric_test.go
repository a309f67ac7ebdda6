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
	cmd := exec.Command("ip", "netns", "exec", ns, bin)
	cmd.Env = env
	logf, _ := os.Create(filepath.Join(dir, "vpcipd.log"))
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	client := api.NewClient(filepath.Join(dir, "s.sock"), 5*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := client.Status(context.Background())
		if err == nil && st.Ready && st.Warm >= 12 {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "vpcipd.log"))
			t.Fatalf("vpcipd not ready in the fabric: %v %+v\n%s", err, st, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("vpcipd after SIGTERM: %v", err)
	}
	stopped = true
}
