package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
)

// A daemon killed during ModifyNetworkInterfaceAttribute leaves its new ENI
// attached without delete-on-termination; the restarted daemon adopts the
// ENI and must set it, or the ENI outlives the instance.
func TestENIAdoptedAfterKillDuringModifyGetsDeleteOnTermination(t *testing.T) {
	// A whole ENI warm (WARM_ENI_TARGET=1): 4 pods make the pool create one.
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", DaemonEnv: []string{"WARM_ENI_TARGET=1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, f := c.Nodes[0], c.Cloud.Faults()
	f.SetLatency("ModifyNetworkInterfaceAttribute", 30*time.Second, 0)
	modified := f.Calls("ModifyNetworkInterfaceAttribute")
	pods := addPods(t, ctx, n, 4, "grow", 4) // below one ENI's worth warm: the pool creates an ENI
	deadline := time.Now().Add(30 * time.Second)
	for f.Calls("ModifyNetworkInterfaceAttribute") == modified && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if f.Calls("ModifyNetworkInterfaceAttribute") == modified {
		t.Fatal("the daemon never set an ENI's attachment attribute")
	}
	time.Sleep(300 * time.Millisecond) // inside the call's latency
	n.StopDaemon(true)
	var adopted string
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.Status == "in-use" && e.DeviceIndex > 0 && !e.DeleteOnTermination {
			adopted = e.ID
		}
	}
	if adopted == "" {
		t.Fatalf("no attached ENI without delete-on-termination after kill -9 during the attribute change: %+v", c.Cloud.NetworkInterfaces())
	}
	f.SetLatency("ModifyNetworkInterfaceAttribute", 0, 0)
	if err := n.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	if e, ok := c.Cloud.NetworkInterface(adopted); !ok || e.Status != "in-use" || !e.DeleteOnTermination {
		t.Errorf("adopted ENI %s after the restart: %+v (exists %v), want in-use with delete-on-termination", adopted, e, ok)
	}
	for _, p := range pods {
		if err := n.DelPod(ctx, p); err != nil {
			t.Error(err)
		}
	}
}
