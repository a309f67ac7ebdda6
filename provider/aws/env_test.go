package awsprovider

import (
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/provider/providertest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

const (
	testCluster  = "test-cluster"
	testType     = "c5.4xlarge" // 8 ENIs × 30 addresses, Nitro
	testZone     = "us-west-2a"
	testPageSize = 5 // EC2's smallest MaxResults
)

// sim is a vpcsim cloud on loopback with one launched instance.
type sim struct {
	local *vpcsimtest.Local
	inst  vpcsim.InstanceInfo
	small string // id of the /28 subnet, tagged smallTags
	other string // id of the subnet in us-west-2b
}

var smallTags = map[string]string{"kubernetes.io/role/cni": "1", "Name": "small"}

func startSim(t testing.TB) *sim {
	t.Helper()
	l := vpcsimtest.Start(t, vpcsim.Config{DetachDelay: 50 * time.Millisecond, Subnets: []vpcsim.SubnetSpec{
		{CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: testZone},
		{CIDR: netip.MustParsePrefix("100.64.16.0/28"), AvailabilityZone: testZone, Tags: smallTags},
		{CIDR: netip.MustParsePrefix("100.64.32.0/20"), AvailabilityZone: "us-west-2b"},
	}})
	s := &sim{local: l, inst: l.Launch(t, testType)}
	for _, sub := range l.Cloud.Subnets() {
		if sub.CIDR.Bits() == 28 {
			s.small = sub.ID
		}
		if sub.AvailabilityZone != testZone {
			s.other = sub.ID
		}
	}
	return s
}

// awsConfig is the SDK configuration for the sim's EC2 API and the
// instance's IMDS, loaded the standard way with explicit endpoints.
// ec2URL "" is the sim's own EC2 listener.
func (s *sim) awsConfig(t testing.TB, ec2URL string) aws.Config {
	t.Helper()
	if ec2URL == "" {
		ec2URL = s.local.EC2URL
	}
	cfg, err := config.LoadDefaultConfig(t.Context(),
		config.WithRegion("us-west-2"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDVPCSIMTEST", "secret", "")),
		config.WithBaseEndpoint(ec2URL),
		config.WithEC2IMDSEndpoint(s.local.IMDSURL(s.inst.ID)),
		config.WithSharedConfigFiles([]string{}),
		config.WithSharedCredentialsFiles([]string{}),
	)
	if err != nil {
		t.Fatalf("loading SDK config: %v", err)
	}
	return cfg
}

// testOptions are fast settings for tests: generous budgets, short waits.
func testOptions() Options {
	return Options{
		ClusterName: testCluster, NodeName: "node-a",
		MutatingRate: 1000, MutatingBurst: 100, DescribeRate: 1000, DescribeBurst: 100,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, MaxThrottleWait: 10 * time.Second,
		MetadataWait: 10 * time.Second, MetadataPoll: 20 * time.Millisecond,
		DetachWait: 10 * time.Second, DetachPoll: 10 * time.Millisecond,
		PageSize: testPageSize,
	}
}

func (s *sim) client(t testing.TB, opts Options, ec2URL string) *Client {
	t.Helper()
	cfg := s.awsConfig(t, ec2URL)
	opts.AWSConfig = &cfg
	c, err := New(t.Context(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// raw is an SDK EC2 client outside the provider, for the suite's
// out-of-band actions.
func (s *sim) raw(t *testing.T) *ec2.Client {
	return ec2.NewFromConfig(s.awsConfig(t, ""))
}

func TestContract(t *testing.T) {
	providertest.Run(t, func(t *testing.T) providertest.Env {
		s := startSim(t)
		return providertest.Env{
			Provider:          s.client(t, testOptions(), ""),
			InstanceType:      testType,
			PageSize:          testPageSize,
			SmallSubnetID:     s.small,
			SmallSubnetTags:   smallTags,
			OtherZoneSubnetID: s.other,
			MetadataLag:       3 * time.Second,
			Cloud:             simCloud{s},
		}
	})
}

// simCloud is the cloud's side of the contract suite's Env.
type simCloud struct{ *sim }

func (c simCloud) faults() *vpcsim.Faults { return c.local.Cloud.Faults() }

func (c simCloud) FailNext(op, code string) { c.faults().FailNext(op, code) }
func (c simCloud) SetThrottle(mutating bool, perSecond float64, burst int) {
	c.faults().SetThrottle(mutating, perSecond, burst)
}
func (c simCloud) SetMetadataLag(d time.Duration) { c.faults().SetIMDSLag(d) }
func (c simCloud) Calls(op string) int            { return c.faults().Calls(op) }

func (c simCloud) ENI(id string) (providertest.CloudENI, bool) {
	e, ok := c.local.Cloud.NetworkInterface(id)
	if !ok {
		return providertest.CloudENI{}, false
	}
	return providertest.CloudENI{
		Status: e.Status, InstanceID: e.InstanceID, DeviceNumber: e.DeviceIndex,
		DeleteOnTermination: e.DeleteOnTermination, SubnetID: e.SubnetID, PrimaryIP: e.PrimaryIP,
		SecondaryIPs: e.SecondaryIPs, Prefixes: e.Prefixes, Tags: e.Tags,
		IPv6Addresses: e.IPv6Addresses, IPv6Prefixes: e.IPv6Prefixes,
	}, true
}

func (c simCloud) ENIIDs() []string {
	var ids []string
	for _, e := range c.local.Cloud.NetworkInterfaces() {
		ids = append(ids, e.ID)
	}
	return ids
}

// MetadataLists reads the instance's IMDS with plain HTTP (IMDSv2 token,
// then local-ipv4s and ipv4-prefix of the ENI's MAC).
func (c simCloud) MetadataLists(t *testing.T, eniID string, p netip.Prefix) bool {
	t.Helper()
	e, ok := c.local.Cloud.NetworkInterface(eniID)
	if !ok {
		t.Fatalf("the cloud has no ENI %s", eniID)
	}
	base := c.local.IMDSURL(c.inst.ID)
	req, _ := http.NewRequest(http.MethodPut, base+"/latest/api/token", nil)
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	token := httpBody(t, req)
	for _, leaf := range []string{"local-ipv4s", "ipv4-prefix"} {
		req, _ := http.NewRequest(http.MethodGet, base+"/latest/meta-data/network/interfaces/macs/"+e.MAC+"/"+leaf, nil)
		req.Header.Set("X-aws-ec2-metadata-token", token)
		for _, f := range strings.Fields(httpBody(t, req)) {
			if f == p.String() || (p.Bits() == 32 && f == p.Addr().String()) {
				return true
			}
		}
	}
	return false
}

// httpBody returns the body of a 200 answer, "" for a 404.
func httpBody(t *testing.T, req *http.Request) string {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return string(b)
	case http.StatusNotFound:
		return ""
	}
	t.Fatalf("%s %s: %s", req.Method, req.URL, resp.Status)
	return ""
}

func (c simCloud) DetachOutOfBand(t *testing.T, eniID string) {
	t.Helper()
	e, ok := c.local.Cloud.NetworkInterface(eniID)
	if !ok {
		t.Fatalf("the cloud has no ENI %s", eniID)
	}
	_, err := c.raw(t).DetachNetworkInterface(t.Context(), &ec2.DetachNetworkInterfaceInput{AttachmentId: aws.String(e.AttachmentID)})
	if err != nil {
		t.Fatalf("DetachNetworkInterface %s: %v", eniID, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if e, _ := c.local.Cloud.NetworkInterface(eniID); e.Status == "available" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become available after detaching", eniID)
		}
	}
}

func (c simCloud) CreateForeignENIs(t *testing.T) []string {
	t.Helper()
	old := time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)
	var ids []string
	for _, tags := range []map[string]string{
		nil,
		{TagCluster: "another-cluster", TagCreatedAt: old},
		{"team": testCluster, TagCreatedAt: old},
	} {
		in := &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(c.inst.SubnetID)}
		if tags != nil {
			in.TagSpecifications = []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: ec2Tags(tags)}}
		}
		out, err := c.raw(t).CreateNetworkInterface(t.Context(), in)
		if err != nil {
			t.Fatalf("CreateNetworkInterface: %v", err)
		}
		ids = append(ids, aws.ToString(out.NetworkInterface.NetworkInterfaceId))
	}
	slices.Sort(ids)
	return ids
}
