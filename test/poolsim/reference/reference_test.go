package reference_test

import (
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/poolsim"
	"github.com/vpcip/vpcip/test/poolsim/reference"
)

// m4.4xlarge: 8 ENIs × 30 IPv4 (the reference README's worked example).
var m44x = poolsim.InstanceType{Name: "m4.4xlarge", Limits: provider.Limits{MaxENIs: 8, IPv4PerENI: 30, PrefixDelegation: true}, MaxPods: 234}

// hold runs n long-lived pods, one every 10 s, against the reference with
// cfg, and returns the result after the pool settled.
func hold(t *testing.T, n int, cfg reference.Config) poolsim.Result {
	t.Helper()
	tr := poolsim.Trace{Name: "hold", Duration: time.Hour}
	for i := range n {
		tr.Pods = append(tr.Pods, poolsim.Pod{Arrive: time.Duration(i) * 10 * time.Second, Life: 2 * time.Hour})
	}
	res, err := poolsim.Simulate(tr, m44x, poolsim.DefaultLatencies, poolsim.Behaviour{}, 1, func(c *poolsim.Clock, cloud *poolsim.Cloud) (poolsim.Pool, error) {
		return reference.New(cloud, c.Now, cfg, 1), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestWorkedExample: WARM_ENI_TARGET=1 on an m4.4xlarge holds 2 ENIs (58
// IPs) for 1–29 pods and 3 ENIs (87 IPs) for 30–58 (reference README);
// EndHeld counts each secondary ENI's own primary address too.
func TestWorkedExample(t *testing.T) {
	for _, tc := range []struct{ pods, enis, ips int }{{1, 2, 58}, {20, 2, 58}, {29, 2, 58}, {30, 3, 87}, {58, 3, 87}} {
		res := hold(t, tc.pods, reference.Config{WarmENITarget: 1})
		if res.EndENIs != tc.enis || res.EndHeld != tc.ips+tc.enis-1 {
			t.Errorf("%d pods: %d ENIs holding %d; want %d ENIs, %d IPs (+%d ENI primaries)", tc.pods, res.EndENIs, res.EndHeld, tc.enis, tc.ips, tc.enis-1)
		}
		if res.Unstarted != 0 {
			t.Errorf("%d pods: %d never started", tc.pods, res.Unstarted)
		}
	}
}

// TestPrefixTarget: WARM_PREFIX_TARGET=1 keeps a whole free /28: 20 pods
// hold 3 prefixes (48 addresses) on the primary ENI.
func TestPrefixTarget(t *testing.T) {
	res := hold(t, 20, reference.Config{WarmPrefixTarget: 1, PrefixDelegation: true})
	if res.EndENIs != 1 || res.EndHeld != 48 {
		t.Errorf("%d ENIs holding %d; want 1 ENI, 48 addresses", res.EndENIs, res.EndHeld)
	}
}

// TestIPTargets: WARM_IP_TARGET=5, MINIMUM_IP_TARGET=10: 20 pods hold 25
// addresses; 3 pods hold the minimum, 10.
func TestIPTargets(t *testing.T) {
	for _, tc := range []struct{ pods, held int }{{20, 25}, {3, 10}} {
		res := hold(t, tc.pods, reference.Config{WarmIPTarget: 5, MinimumIPTarget: 10})
		if res.EndHeld != tc.held || res.EndENIs != 1 {
			t.Errorf("%d pods: %d ENIs holding %d; want 1 ENI, %d", tc.pods, res.EndENIs, res.EndHeld, tc.held)
		}
	}
}
