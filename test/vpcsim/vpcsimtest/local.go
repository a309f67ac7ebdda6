// Package vpcsimtest starts vpcsim for Go tests: the EC2 Query API and one
// IMDSv2 listener per instance on loopback, cleaned up when the test ends.
package vpcsimtest

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// Local is a vpcsim cloud served on loopback, without network namespaces.
type Local struct {
	Cloud  *vpcsim.Cloud
	EC2URL string // "http://127.0.0.1:port", for the SDK's BaseEndpoint or AWS_ENDPOINT_URL_EC2

	t    testing.TB
	mu   sync.Mutex // guards imds
	imds map[string]*httptest.Server
}

// Start builds a cloud from cfg and serves its EC2 API on 127.0.0.1:0.
// Everything stops with t.Cleanup. It fails the test when cfg is invalid.
func Start(t testing.TB, cfg vpcsim.Config) *Local {
	t.Helper()
	c, err := vpcsim.New(cfg)
	if err != nil {
		t.Fatalf("vpcsim: %v", err)
	}
	srv := httptest.NewServer(c.EC2Handler())
	l := &Local{Cloud: c, EC2URL: srv.URL, t: t, imds: map[string]*httptest.Server{}}
	t.Cleanup(func() {
		srv.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, s := range l.imds {
			s.Close()
		}
	})
	return l
}

// IMDSURL returns the base URL ("http://127.0.0.1:port") of an IMDSv2
// listener bound to the instance, starting it on the first call. Point the
// SDK's imds.Options.Endpoint or AWS_EC2_METADATA_SERVICE_ENDPOINT at it.
func (l *Local) IMDSURL(instanceID string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.imds[instanceID]; ok {
		return s.URL
	}
	h := l.Cloud.IMDSHandler(func(*http.Request) (string, bool) { return instanceID, true })
	s := httptest.NewServer(h)
	l.imds[instanceID] = s
	return s.URL
}

// Launch starts an instance of the EC2 instance type in the first subnet,
// failing the test if it cannot.
func (l *Local) Launch(t testing.TB, instanceType string) vpcsim.InstanceInfo {
	t.Helper()
	inst, err := l.Cloud.LaunchInstance(instanceType, "")
	if err != nil {
		t.Fatalf("vpcsim: launch %s: %v", instanceType, err)
	}
	return inst
}

// Env returns the environment a process on the instance needs to reach this
// cloud through the AWS SDK: AWS_ENDPOINT_URL_EC2, AWS_EC2_METADATA_SERVICE_ENDPOINT
// (the instance's IMDS listener), AWS_REGION and dummy static credentials.
func (l *Local) Env(instanceID string) []string {
	return []string{
		"AWS_ENDPOINT_URL_EC2=" + l.EC2URL,
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + l.IMDSURL(instanceID),
		"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv4",
		"AWS_REGION=" + l.Cloud.Region(),
		"AWS_ACCESS_KEY_ID=AKIDVPCSIM",
		"AWS_SECRET_ACCESS_KEY=vpcsim",
	}
}
