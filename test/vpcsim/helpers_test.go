package vpcsim_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// ec2Client returns an aws-sdk-go-v2 EC2 client for the local cloud, with
// dummy static credentials and no retries (so refusals surface at once).
func ec2Client(l *vpcsimtest.Local) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:           "us-west-2",
		BaseEndpoint:     aws.String(l.EC2URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		RetryMaxAttempts: 1,
	})
}

func imdsClient(l *vpcsimtest.Local, instanceID string) *imds.Client {
	return imds.New(imds.Options{Endpoint: l.IMDSURL(instanceID)})
}

// wantAPIError checks that err is the EC2 error code with the HTTP status.
func wantAPIError(t *testing.T, err error, code string, status int) {
	t.Helper()
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("got error %v, want EC2 error %s", err, code)
	}
	if ae.ErrorCode() != code {
		t.Fatalf("got error code %s (%s), want %s", ae.ErrorCode(), ae.ErrorMessage(), code)
	}
	var re *awshttp.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("error %v carries no HTTP response", err)
	}
	if re.HTTPStatusCode() != status {
		t.Fatalf("%s: got HTTP %d, want %d", code, re.HTTPStatusCode(), status)
	}
}

func mustENI(t *testing.T, c *vpcsim.Cloud, id string) vpcsim.ENIInfo {
	t.Helper()
	e, ok := c.NetworkInterface(id)
	if !ok {
		t.Fatalf("ENI %s not in the model", id)
	}
	return e
}

func mustSubnet(t *testing.T, c *vpcsim.Cloud, id string) vpcsim.SubnetInfo {
	t.Helper()
	s, ok := c.Subnet(id)
	if !ok {
		t.Fatalf("subnet %s not in the model", id)
	}
	return s
}

func addrs(ss []string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

var ctx = context.Background()
