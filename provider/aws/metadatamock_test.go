package awsprovider

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	aemm "github.com/aws/amazon-ec2-metadata-mock/pkg/cmd/root"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

var (
	aemmOnce sync.Once
	aemmURL  string
	aemmErr  error
)

// startMetadataMock runs AWS's IMDS simulator (amazon-ec2-metadata-mock, its
// default single-ENI instance, IMDSv2 only) in the test process. It keeps
// process-wide state and cannot be stopped, so there is one per test binary.
func startMetadataMock(t *testing.T) string {
	t.Helper()
	aemmOnce.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			aemmErr = err
			return
		}
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		log.SetOutput(io.Discard) // the mock logs every request through the standard logger
		cmd := aemm.NewCmd()
		cmd.SetArgs([]string{"--hostname", "127.0.0.1", "--port", port, "--imdsv2"})
		go cmd.Execute()
		aemmURL = "http://127.0.0.1:" + port
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			req, _ := http.NewRequest(http.MethodPut, aemmURL+"/latest/api/token", nil)
			req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				return
			}
		}
		aemmErr = net.ErrClosed
	})
	if aemmErr != nil {
		t.Fatalf("amazon-ec2-metadata-mock did not start: %v", aemmErr)
	}
	return aemmURL
}

// TestMetadataAgainstAWSMock reads the mock's default instance (its
// documented default values) through Self and MetadataENIs.
func TestMetadataAgainstAWSMock(t *testing.T) {
	url := startMetadataMock(t)
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")}
	c, err := New(t.Context(), Options{ClusterName: testCluster, AWSConfig: &cfg,
		IMDSOptions: []func(*imds.Options){func(o *imds.Options) { o.Endpoint = url }}})
	if err != nil {
		t.Fatal(err)
	}
	self, err := c.Self(t.Context())
	if err != nil {
		t.Fatalf("Self: %v", err)
	}
	if self.ID != "i-1234567890abcdef0" || self.Type != "m4.xlarge" || self.AvailabilityZone != "us-east-1a" || self.Region != "us-east-1" {
		t.Errorf("Self() identity = %+v", self)
	}
	if self.PrimaryMAC != "0e:49:61:0f:c3:11" || self.PrimaryENI != "eni-0f95d3625f5c521cc" || self.PrimaryIP != netip.MustParseAddr("172.16.34.43") {
		t.Errorf("Self() primary ENI = %s %s %v", self.PrimaryMAC, self.PrimaryENI, self.PrimaryIP)
	}
	if self.VPCID != "vpc-d295a6a7" || len(self.VPCCIDRs) != 1 || self.VPCCIDRs[0] != netip.MustParsePrefix("192.0.2.0/24") {
		t.Errorf("Self() VPC = %s %v", self.VPCID, self.VPCCIDRs)
	}
	if self.SubnetID != "subnet-0ac62554" || len(self.SecurityGroups) != 1 || self.SecurityGroups[0] != "sg-0b07f8f6cb485d4df" {
		t.Errorf("Self() subnet %s groups %v", self.SubnetID, self.SecurityGroups)
	}
	enis, err := c.MetadataENIs(t.Context())
	if err != nil {
		t.Fatalf("MetadataENIs: %v", err)
	}
	if len(enis) != 1 {
		t.Fatalf("MetadataENIs() = %+v, want the one ENI", enis)
	}
	e := enis[0]
	if e.ID != self.PrimaryENI || e.MAC != self.PrimaryMAC || e.DeviceNumber != 0 || e.NetworkCard != 0 ||
		e.PrimaryIP != self.PrimaryIP || len(e.SecondaryIPs) != 0 || len(e.Prefixes) != 0 ||
		e.SubnetCIDR != netip.MustParsePrefix("192.0.2.0/24") || e.Gateway != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("MetadataENIs()[0] = %+v", e)
	}
}
