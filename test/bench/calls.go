package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// ec2Actions are the EC2 API actions vpcsim serves; their sum is the number
// of cloud calls the daemons made.
var ec2Actions = []string{
	"DescribeInstances", "DescribeInstanceTypes", "DescribeSubnets", "DescribeSecurityGroups",
	"DescribeNetworkInterfaces", "CreateNetworkInterface", "AttachNetworkInterface",
	"DetachNetworkInterface", "DeleteNetworkInterface", "ModifyNetworkInterfaceAttribute",
	"AssignPrivateIpAddresses", "UnassignPrivateIpAddresses", "CreateTags", "DeleteTags",
}

func totalCalls(cloud *vpcsim.Cloud) int {
	n := 0
	for _, a := range ec2Actions {
		n += cloud.Faults().Calls(a)
	}
	return n
}

// settle waits until the call count has not moved for quiet, at most limit.
func settle(ctx context.Context, cloud *vpcsim.Cloud, quiet, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	last, since := totalCalls(cloud), time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(250 * time.Millisecond)
		if n := totalCalls(cloud); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= quiet {
			break
		}
	}
	return last
}

// cloudCalls measures (d) with default settings on one m5.4xlarge node.
func (b *bench) cloudCalls(ctx context.Context) error {
	work, err := os.MkdirTemp("", "vpcip-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	c, err := cluster.Start(ctx, cluster.Options{Prefix: b.prefix("bc"), Nodes: 1, InstanceType: "m5.4xlarge", BinDir: b.bin, WorkDir: work})
	if err != nil {
		return err
	}
	defer c.Close()
	node := c.Nodes[0]
	c0 := settle(ctx, c.Cloud, 3*time.Second, 30*time.Second)
	var pods []*podruntime.Pod
	for i := range b.callPods {
		p, err := node.AddPod(ctx, "bench", fmt.Sprintf("calls-%d", i))
		if err != nil {
			return err
		}
		pods = append(pods, p)
	}
	c1 := settle(ctx, c.Cloud, 5*time.Second, 60*time.Second)
	for _, p := range pods {
		if err := node.DelPod(ctx, p); err != nil {
			return err
		}
	}
	// Default IP_COOLDOWN_PERIOD is 30 s and ENIs younger than 1 minute are
	// kept: count what follows the deletes for b.deleteWindow (90 s).
	time.Sleep(b.deleteWindow)
	c2 := totalCalls(c.Cloud)
	b.add(Figure{Name: "(d) EC2 calls at start-up (1 node)", Value: float64(c0), Unit: "calls"})
	b.add(Figure{Name: fmt.Sprintf("(d) EC2 calls per %d pod starts", b.callPods), Value: float64(c1 - c0), Unit: "calls"})
	b.add(Figure{Name: fmt.Sprintf("(d) EC2 calls per %d pod deletes (%s)", b.callPods, b.deleteWindow), Value: float64(c2 - c1), Unit: "calls"})
	return nil
}
