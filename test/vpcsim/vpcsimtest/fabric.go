package vpcsimtest

import (
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// Fabricated is a vpcsim cloud mirrored in a netns fabric, with its EC2 API
// and IMDS served inside the fabric, as a daemon in an instance netns finds
// them on EC2.
type Fabricated struct {
	Cloud  *vpcsim.Cloud
	Fabric *fabric.Fabric
	// EC2URL is the EC2 API as seen from inside every instance netns:
	// fabric.EC2URL, "http://169.254.169.254:8080".
	EC2URL string
	// IMDSURL is IMDS as seen from inside every instance netns:
	// "http://169.254.169.254". It answers for the calling instance.
	IMDSURL string
	// LocalEC2URL is the same EC2 API on loopback ("http://127.0.0.1:port")
	// for the test itself, which runs outside the fabric.
	LocalEC2URL string
}

// StartFabric builds a cloud from cfg and a fabric whose every netns and
// link name starts with prefix (1 to 6 characters [a-z0-9], unique to the
// test), sets the fabric as the cloud's observer and serves the EC2 API and
// IMDS inside it. It skips the test when not run as root. When the test ends
// everything is stopped and removed, and errors the fabric met while
// mirroring the model fail the test.
func StartFabric(t testing.TB, cfg vpcsim.Config, prefix string) *Fabricated {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("vpcsim fabric needs root for network namespaces")
	}
	c, err := vpcsim.New(cfg)
	if err != nil {
		t.Fatalf("vpcsim: %v", err)
	}
	fab, err := fabric.New(prefix)
	if err != nil {
		t.Fatalf("vpcsim: %v", err)
	}
	t.Cleanup(func() {
		if err := fab.Close(); err != nil {
			t.Errorf("vpcsim: %v", err)
		}
		if err := fabric.Cleanup(prefix); err != nil {
			t.Errorf("vpcsim: %v", err)
		}
		if err := fab.Err(); err != nil {
			t.Errorf("vpcsim: fabric did not mirror the model: %v", err)
		}
	})
	c.SetObserver(fab)
	srv, err := fab.Serve(c)
	if err != nil {
		t.Fatalf("vpcsim: %v", err)
	}
	local := httptest.NewServer(c.EC2Handler())
	t.Cleanup(func() {
		local.Close()
		srv.Close()
	})
	return &Fabricated{Cloud: c, Fabric: fab, EC2URL: fabric.EC2URL, IMDSURL: fabric.IMDSURL, LocalEC2URL: local.URL}
}

// Launch starts an instance of the EC2 instance type in the first subnet and
// fails the test if it cannot, or if its netns could not be made.
func (f *Fabricated) Launch(t testing.TB, instanceType string) vpcsim.InstanceInfo {
	t.Helper()
	inst, err := f.Cloud.LaunchInstance(instanceType, "")
	if err != nil {
		t.Fatalf("vpcsim: launch %s: %v", instanceType, err)
	}
	if err := f.Fabric.Err(); err != nil {
		t.Fatalf("vpcsim: launch %s: %v", instanceType, err)
	}
	return inst
}

// NetnsPath returns the path of an instance's netns
// ("/var/run/netns/<prefix>-..."), for CNI_NETNS-style use or ns.GetNS.
func (f *Fabricated) NetnsPath(instanceID string) string {
	return fabric.NetnsPath(f.Fabric.NodeNetns(instanceID))
}

// HTTPClient returns a client whose connections are made inside the
// instance's netns, so that the test speaks to EC2URL and IMDSURL as that
// instance (IMDS knows it by its primary address). Pass it to the SDK as
// HTTPClient.
func (f *Fabricated) HTTPClient(instanceID string) *http.Client {
	tr := &http.Transport{DialContext: fabric.DialContext(f.Fabric.NodeNetns(instanceID))}
	return &http.Client{Transport: tr}
}

// Env is the environment for a process run inside an instance netns (e.g.
// vpcipd under `ip netns exec`): fabric.NodeEnv for the cloud's region.
func (f *Fabricated) Env() []string {
	return fabric.NodeEnv(f.Cloud.Region())
}
