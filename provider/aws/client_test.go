package awsprovider

import (
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// TestStandardConfiguration points the client at vpcsim only through the
// SDK's environment variables, as the daemon is configured.
func TestStandardConfiguration(t *testing.T) {
	s := startSim(t)
	dir := t.TempDir()
	t.Setenv("AWS_ENDPOINT_URL_EC2", s.local.EC2URL)
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", s.local.IMDSURL(s.inst.ID))
	t.Setenv("AWS_REGION", "us-west-2")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDVPCSIMTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	c, err := New(t.Context(), Options{ClusterName: testCluster})
	if err != nil {
		t.Fatal(err)
	}
	self, err := c.Self(t.Context())
	if err != nil {
		t.Fatalf("Self: %v", err)
	}
	if self.ID != s.inst.ID || self.PrimaryENI != s.inst.PrimaryENI.ID || self.Region != "us-west-2" {
		t.Errorf("Self() = %+v, want instance %s with ENI %s", self, s.inst.ID, s.inst.PrimaryENI.ID)
	}
	enis, err := c.ENIs(t.Context())
	if err != nil || len(enis) != 1 || enis[0].ID != s.inst.PrimaryENI.ID {
		t.Errorf("ENIs() = %+v, %v; want the primary ENI", enis, err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{{}, {ClusterName: "c", PageSize: 4}, {ClusterName: "c", MutatingRate: -1}} {
		if _, err := New(t.Context(), o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// TestMetadataNeverCatchesUp: when IMDS lags beyond MetadataWait,
// AssignAddresses still returns what EC2 assigned, with ErrNotVisible, and
// MetadataENIs does not report the addresses before IMDS shows them.
func TestMetadataNeverCatchesUp(t *testing.T) {
	s := startSim(t)
	opts := testOptions()
	opts.MetadataWait = 300 * time.Millisecond
	c := s.client(t, opts, "")
	if _, err := c.MetadataENIs(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.local.Cloud.Faults().SetIMDSLag(5 * time.Second)
	added, err := c.AssignAddresses(t.Context(), s.inst.PrimaryENI.ID, 2, false)
	if !errors.Is(err, provider.ErrNotVisible) || len(added) != 2 {
		t.Fatalf("AssignAddresses under a 5s lag with a 300ms wait = %v, %v; want 2 addresses and ErrNotVisible", added, err)
	}
	cloud, _ := s.local.Cloud.NetworkInterface(s.inst.PrimaryENI.ID)
	for _, p := range added {
		if !slices.Contains(cloud.SecondaryIPs, p.Addr()) {
			t.Errorf("returned %v is not on the ENI in the cloud (%v)", p, cloud.SecondaryIPs)
		}
	}
	meta, err := c.MetadataENIs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(meta) != 1 || len(meta[0].SecondaryIPs) != 0 {
		t.Errorf("MetadataENIs() = %+v, want the primary ENI without the addresses IMDS does not show yet", meta)
	}
	enis, err := c.ENIs(t.Context())
	if err != nil || len(enis) != 1 || len(enis[0].SecondaryIPs) != 2 {
		t.Errorf("ENIs() = %+v, %v; want EC2's two addresses", enis, err)
	}
}

// TestObserverReportsEveryCall checks the operation and outcome names the
// daemon's metrics are built from.
func TestObserverReportsEveryCall(t *testing.T) {
	s := startSim(t)
	type report struct{ op, outcome string }
	var got []report
	opts := testOptions()
	opts.Observe = func(op, outcome string, latency time.Duration) {
		if latency < 0 {
			t.Errorf("negative latency for %s", op)
		}
		if op != "imds" {
			got = append(got, report{op, outcome})
		}
	}
	c := s.client(t, opts, "")
	s.local.Cloud.Faults().FailNext("AssignPrivateIpAddresses", "RequestLimitExceeded")
	if _, err := c.AssignAddresses(t.Context(), s.inst.PrimaryENI.ID, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AssignAddresses(t.Context(), "eni-0f0f0f0f0f0f0f0f0", 1, false); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	want := []report{
		{"AssignPrivateIpAddresses", "throttled"},
		{"AssignPrivateIpAddresses", "ok"},
		{"AssignPrivateIpAddresses", "not_found"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("observer got %v, want %v", got, want)
	}
}

func TestUnassignRefusesNonAddresses(t *testing.T) {
	c := &Client{}
	for _, p := range []string{"100.64.0.0/24", "100.64.0.8/28", "2001:db8::1/128"} {
		if err := c.UnassignAddresses(t.Context(), "eni-1", []netip.Prefix{netip.MustParsePrefix(p)}); err == nil {
			t.Errorf("UnassignAddresses(%s) succeeded", p)
		}
	}
}

// TestTransientRetries: a 5xx is retried for a describe, which is safe to
// repeat, and not for an assign, whose lost reply may hide a change.
func TestTransientRetries(t *testing.T) {
	s := startSim(t)
	c := s.client(t, testOptions(), "")
	if _, err := c.Self(t.Context()); err != nil {
		t.Fatal(err)
	}
	f := s.local.Cloud.Faults()
	f.FailNext("DescribeNetworkInterfaces", "InternalError")
	before := f.Calls("DescribeNetworkInterfaces")
	if enis, err := c.ENIs(t.Context()); err != nil || len(enis) != 1 {
		t.Errorf("ENIs() after one InternalError = %v, %v; want the primary ENI", enis, err)
	}
	if n := f.Calls("DescribeNetworkInterfaces") - before; n != 2 {
		t.Errorf("%d DescribeNetworkInterfaces calls, want 2 (one retry)", n)
	}
	f.FailNext("AssignPrivateIpAddresses", "InternalError")
	before = f.Calls("AssignPrivateIpAddresses")
	if _, err := c.AssignAddresses(t.Context(), s.inst.PrimaryENI.ID, 1, false); err == nil {
		t.Errorf("AssignAddresses succeeded through an InternalError")
	}
	if n := f.Calls("AssignPrivateIpAddresses") - before; n != 1 {
		t.Errorf("%d AssignPrivateIpAddresses calls, want 1 (not repeated)", n)
	}
	for range 3 {
		f.FailNext("DescribeNetworkInterfaces", "InternalError")
	}
	if _, err := c.ENIs(t.Context()); err == nil {
		t.Errorf("ENIs() succeeded through %d InternalErrors with MaxAttempts 3", 3)
	}
}

// TestMetadataUnreadableAfterTheChange: when IMDS cannot be read at all
// after EC2 made a change (it answers 503, as a loaded host's IMDS times
// out), CreateENI and AssignAddresses still return what EC2 made, with
// ErrNotVisible: the change stands, and a caller that took the error for a
// failure would make another ENI only to have its attach refused at the
// instance's limit (seen in the fleet at 200 nodes).
func TestMetadataUnreadableAfterTheChange(t *testing.T) {
	s := startSim(t)
	opts := testOptions()
	opts.MetadataWait = 300 * time.Millisecond
	c := s.client(t, opts, "")
	if _, err := c.Self(t.Context()); err != nil { // the identity is read while IMDS answers
		t.Fatal(err)
	}
	faults := s.local.Cloud.Faults()
	faults.SetLatency("ModifyNetworkInterfaceAttribute", 150*time.Millisecond, 0)
	go func() {
		// IMDS stops answering once the attach is made, before CreateENI
		// reads the new ENI from it.
		for faults.Calls("AttachNetworkInterface") == 0 && t.Context().Err() == nil {
			time.Sleep(time.Millisecond)
		}
		faults.SetIMDSStatus(503)
	}()
	eni, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2})
	if !errors.Is(err, provider.ErrNotVisible) || eni.ID == "" {
		t.Fatalf("CreateENI with IMDS down after the attach = %+v, %v; want the ENI and ErrNotVisible", eni, err)
	}
	if got, ok := s.local.Cloud.NetworkInterface(eni.ID); !ok || got.InstanceID != s.inst.ID {
		t.Fatalf("ENI %s in the cloud: %+v; want it attached to %s", eni.ID, got, s.inst.ID)
	}
	added, err := c.AssignAddresses(t.Context(), eni.ID, 2, false)
	if !errors.Is(err, provider.ErrNotVisible) || len(added) != 2 {
		t.Fatalf("AssignAddresses with IMDS down = %v, %v; want 2 addresses and ErrNotVisible", added, err)
	}
}

// TestAttemptTimeout: an EC2 request left unanswered is cancelled after
// AttemptTimeout: a describe (safe to repeat) is tried MaxAttempts times
// and then fails naming the timeout, an assign is tried once; once EC2
// answers again, both go through. Without the timeout each attempt would
// wait out the injected 10 s.
func TestAttemptTimeout(t *testing.T) {
	s := startSim(t)
	opts := testOptions()
	opts.AttemptTimeout = 150 * time.Millisecond
	c := s.client(t, opts, "")
	if _, err := c.Self(t.Context()); err != nil {
		t.Fatal(err)
	}
	f := s.local.Cloud.Faults()
	f.SetLatency("DescribeNetworkInterfaces", 10*time.Second, 0)
	f.SetLatency("AssignPrivateIpAddresses", 10*time.Second, 0)
	began := time.Now()
	before := f.Calls("DescribeNetworkInterfaces")
	if _, err := c.ENIs(t.Context()); err == nil || !strings.Contains(err.Error(), "no answer within 150ms") {
		t.Errorf("ENIs() with EC2 silent: %v; want the attempt timeout", err)
	}
	if n := f.Calls("DescribeNetworkInterfaces") - before; n != 3 {
		t.Errorf("%d DescribeNetworkInterfaces attempts, want MaxAttempts (3)", n)
	}
	before = f.Calls("AssignPrivateIpAddresses")
	if _, err := c.AssignAddresses(t.Context(), s.inst.PrimaryENI.ID, 1, false); err == nil {
		t.Errorf("AssignAddresses succeeded with EC2 silent")
	}
	if n := f.Calls("AssignPrivateIpAddresses") - before; n != 1 {
		t.Errorf("%d AssignPrivateIpAddresses attempts, want 1 (its effect is unknown)", n)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("took %v: attempts were not cancelled", took)
	}
	f.Reset()
	if enis, err := c.ENIs(t.Context()); err != nil || len(enis) != 1 {
		t.Errorf("ENIs() once EC2 answers: %v, %v", enis, err)
	}
}
