package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/ipamd/ec2budget"
	"github.com/vpcip/vpcip/provider"
	awsprovider "github.com/vpcip/vpcip/provider/aws"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestSharedBudgetKeepsNodesInsideTheAccountBucket: ten nodes' EC2 clients
// (aws-sdk-go-v2 against vpcsim) each assign 20 addresses one request after
// the other, all nodes at once, against an account bucket for AssignPrivateIpAddresses
// of 10 requests refilled at 20 a second. Paced alone (each node's own
// 2/s, burst 5), the nodes' bursts overrun the bucket and EC2 refuses
// requests. Sharing the bucket through Leases in a real API server (as the
// daemon's ServiceAccount, with the chart's rules), at the default 80 %
// share, no request is refused, and every address is assigned.
func TestSharedBudgetKeepsNodesInsideTheAccountBucket(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	const nodes, perNode = 10, 20
	account := vpcsim.BucketLimit{Capacity: 10, RefillPerSecond: 20}

	k, err := kubetest.Start(kubetest.Options{Name: "budget"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	sa, err := k.ServiceAccountConfigFromFile(t.Context(), "kube-system", "vpcipd", "../../charts/vpcip/files/clusterrole-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}

	run := func(t *testing.T, shared bool) (accepted, throttled int) {
		sim := vpcsimtest.Start(t, vpcsim.Config{})
		sim.Cloud.Faults().SetRequestLimits(vpcsim.RequestLimits{"AssignPrivateIpAddresses": account})
		var wg sync.WaitGroup
		errs := make(chan error, nodes*perNode)
		for i := range nodes {
			inst := sim.Launch(t, "m5.4xlarge") // 29 secondary addresses on the primary ENI
			cfg, err := config.LoadDefaultConfig(t.Context(), config.WithRegion(sim.Cloud.Region()),
				config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDVPCSIMTEST", "secret", "")),
				config.WithBaseEndpoint(sim.EC2URL), config.WithEC2IMDSEndpoint(sim.IMDSURL(inst.ID)),
				config.WithSharedConfigFiles([]string{}), config.WithSharedCredentialsFiles([]string{}))
			if err != nil {
				t.Fatal(err)
			}
			var budget provider.RequestBudget
			if shared { // each node its own API client, as each daemon has
				cs, err := kubernetes.NewForConfig(sa)
				if err != nil {
					t.Fatal(err)
				}
				b, err := ec2budget.New(ec2budget.Options{Client: cs, NodeName: fmt.Sprintf("node-%d", i),
					Limits: map[string]ec2budget.Limit{"AssignPrivateIpAddresses": {Capacity: account.Capacity, RefillPerSecond: account.RefillPerSecond}}})
				if err != nil {
					t.Fatal(err)
				}
				budget = b
			}
			c, err := awsprovider.New(t.Context(), awsprovider.Options{ClusterName: "budget", NodeName: fmt.Sprintf("node-%d", i),
				AWSConfig: &cfg, Budget: budget, RetryBase: 50 * time.Millisecond, RetryMax: time.Second, MaxThrottleWait: time.Minute,
				MetadataPoll: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { // one after the other, as the daemon's worker calls
				for range perNode {
					errs <- assignOne(t.Context(), c, inst.PrimaryENI.ID)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		n := sim.Cloud.Faults().RequestCounts()["AssignPrivateIpAddresses"]
		return n.Accepted, n.Throttled
	}

	t.Run("alone", func(t *testing.T) {
		start := time.Now()
		accepted, throttled := run(t, false)
		t.Logf("paced alone: %d accepted, %d refused, %s", accepted, throttled, time.Since(start).Round(time.Millisecond))
		if throttled == 0 {
			t.Errorf("no request refused: the bucket is too large for this test to show anything")
		}
	})
	t.Run("shared", func(t *testing.T) {
		start := time.Now()
		accepted, throttled := run(t, true)
		t.Logf("shared budget: %d accepted, %d refused, %s", accepted, throttled, time.Since(start).Round(time.Millisecond))
		if accepted != nodes*perNode || throttled != 0 {
			t.Errorf("%d accepted and %d refused, want %d and none", accepted, throttled, nodes*perNode)
		}
	})
}

// assignOne assigns one address on eni as the pool does for a waiting pod,
// looking again when the shared budget says when it has room.
func assignOne(ctx context.Context, c *awsprovider.Client, eni string) error {
	ctx = provider.WithPriority(ctx, provider.PriorityPodWaiting)
	for {
		_, err := c.AssignAddresses(ctx, eni, 1, false)
		var short *provider.BudgetShortError
		if !errors.As(err, &short) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(short.Wait):
		}
	}
}
