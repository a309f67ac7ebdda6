package cnitest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// realDaemon is vpcipd running inside a vpcsim instance netns against
// vpcsim's EC2 API and IMDS through the fabric, with host networking on.
type realDaemon struct {
	bin, dir string
	node     *Node
	env      []string
	cmd      *exec.Cmd
	done     chan error
}

func (d *realDaemon) Socket() string { return filepath.Join(d.dir, "ipamd.sock") }

func (d *realDaemon) Start(t testing.TB) {
	t.Helper()
	if d.cmd != nil {
		return
	}
	logf, err := os.OpenFile(filepath.Join(d.dir, "vpcipd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(d.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = d.env, logf, logf
	if err := d.node.Do(cmd.Start); err != nil {
		logf.Close()
		t.Fatalf("start vpcipd in %s: %v", d.node.Name, err)
	}
	d.cmd, d.done = cmd, make(chan error, 1)
	go func() { d.done <- cmd.Wait(); logf.Close() }()
	c := api.NewClient(d.Socket(), 2*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := c.Status(context.Background())
		if err == nil && st.Ready {
			return
		}
		select {
		case err := <-d.done:
			d.cmd = nil
			t.Fatalf("vpcipd exited before ready: %v; log:\n%s", err, d.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vpcipd not ready after 60 s (%+v, %v); log:\n%s", st, err, d.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (d *realDaemon) Stop(t testing.TB) {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	d.cmd = nil
}

func (d *realDaemon) log() string {
	b, _ := os.ReadFile(filepath.Join(d.dir, "vpcipd.log"))
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// vpc is vpcsim (EC2 API and IMDS served in the fabric's router netns) with
// instances, each running vpcipd in its netns.
type vpc struct {
	cloud   *vpcsim.Cloud
	fab     *fabric.Fabric
	insts   []vpcsim.InstanceInfo
	nodes   []*Node
	daemons []*realDaemon
}

// startVPC brings up vpcsim with n instances of itype and vpcipd in each;
// everything goes at cleanup.
func startVPC(t testing.TB, itype string, n int) *vpc {
	t.Helper()
	bin := filepath.Join(filepath.Dir(BuildPlugin(t)), "vpcipd")
	if _, err := os.Stat(bin); err != nil {
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/vpcip/vpcip/cmd/vpcipd").CombinedOutput(); err != nil {
			t.Fatalf("go build cmd/vpcipd: %v\n%s", err, out)
		}
	}
	cloud, err := vpcsim.New(vpcsim.Config{Seed: 6})
	if err != nil {
		t.Fatal(err)
	}
	// The fabric allows 6 characters [a-z0-9] (its link names must fit 15
	// bytes), so its netns are "vctXXX-..." rather than "vct-...".
	prefix := "vct" + randomHex(2)[:3]
	fab, err := fabric.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fabric.Cleanup(prefix); _ = fab.Close() })
	cloud.SetObserver(fab)
	servers, err := fab.Serve(cloud)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = servers.Close() })
	v := &vpc{cloud: cloud, fab: fab}
	for range n {
		inst, err := cloud.LaunchInstance(itype, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := fab.Err(); err != nil {
			t.Fatal(err)
		}
		node := OpenNode(t, fab.NodeNetns(inst.ID))
		d := newRealDaemon(t, bin, node, cloud.Region(), inst.ID)
		d.Start(t)
		t.Cleanup(func() { d.Stop(t) })
		v.insts, v.nodes, v.daemons = append(v.insts, inst), append(v.nodes, node), append(v.daemons, d)
	}
	return v
}

// realGCGrace is the daemons' VPCIP_GC_GRACE: its least accepted value
// (config.MinGCGrace), so GC tests wait as little as they can.
const realGCGrace = 10 * time.Second

// GCGrace is how old an assignment must be before GC releases it.
func (d *realDaemon) GCGrace() time.Duration { return realGCGrace }

func newRealDaemon(t testing.TB, bin string, node *Node, region, instanceID string) *realDaemon {
	dir := t.TempDir()
	d := &realDaemon{bin: bin, dir: dir, node: node}
	d.env = append(fabric.NodeEnv(region),
		"PATH="+os.Getenv("PATH"),
		"VPCIP_SOCKET="+d.Socket(),
		"VPCIP_CHECKPOINT="+filepath.Join(dir, "ipam.json"),
		"VPCIP_METRICS_ADDR=off",
		"VPCIP_INTROSPECTION_ADDR=off",
		"VPCIP_GC_GRACE="+realGCGrace.String(),
		"VPCIP_ADD_WAIT=30s",
		"VPCIP_POOL_INTERVAL=200ms",
		"VPCIP_CLUSTER_NAME=vct",
		"AWS_VPC_K8S_CNI_LOGLEVEL=DEBUG",
		"MY_NODE_NAME="+instanceID,
	)
	return d
}

// TestSuiteVpcipd runs the plugin contract against the real daemon on
// vpcsim: one m5.4xlarge node (8 ENIs × 30 addresses), pods on the primary
// and secondary ENIs, host networking set up by vpcipd itself.
func TestSuiteVpcipd(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.4xlarge", 1)
	node, d := v.nodes[0], v.daemons[0]
	RunSuite(t, Setup{NewEnv: func(t *testing.T) *Env {
		if d.cmd == nil {
			d.Start(t)
		}
		return NewEnv(t, node, d)
	}})
	if t.Failed() {
		t.Logf("vpcipd log tail:\n%s", d.log())
	}
}
