package vpcsim_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// ec2ClientFrom is an SDK client whose connections leave from the loopback
// address src (127.0.0.0/8 is all local on Linux), so that vpcsim sees two
// callers as two instances would be seen on EC2. retries is the SDK's
// RetryMaxAttempts.
func ec2ClientFrom(l *vpcsimtest.Local, src string, retries int) *ec2.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) { tr.DialContext = d.DialContext })
	return ec2.New(ec2.Options{
		Region:           "us-west-2",
		BaseEndpoint:     aws.String(l.EC2URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		RetryMaxAttempts: retries,
		HTTPClient:       hc,
	})
}

func tag(cli *ec2.Client, eniID string) error {
	_, err := cli.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{eniID}, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
	return err
}

// TestAccountBucketSharedByInstances: two instances' callers draw from one
// account-wide bucket per action, with AWS's documented capacity and refill
// rate (CreateTags: 100 tokens, 10 a second), and the refusal is the error
// aws-sdk-go-v2 classifies as throttling.
func TestAccountBucketSharedByInstances(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := testConfig()
	cfg.Clock = clock.Now
	l := vpcsimtest.Start(t, cfg)
	f := l.Cloud.Faults()
	f.SetRequestLimits(vpcsim.AWSRequestLimits())
	a, b := launchIn(t, l, "m5.large", subnetBig), launchIn(t, l, "m5.large", subnetBig)
	cliA, cliB := ec2ClientFrom(l, "127.0.0.2", 1), ec2ClientFrom(l, "127.0.0.3", 1)

	// 100 calls, half from each instance, empty the shared bucket.
	for i := range 50 {
		if err := tag(cliA, a.PrimaryENI.ID); err != nil {
			t.Fatalf("call %d from A: %v", 2*i+1, err)
		}
		if err := tag(cliB, b.PrimaryENI.ID); err != nil {
			t.Fatalf("call %d from B: %v", 2*i+2, err)
		}
	}
	for _, cli := range []*ec2.Client{cliA, cliB} {
		err := tag(cli, a.PrimaryENI.ID)
		wantAPIError(t, err, "RequestLimitExceeded", 503)
		if retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err) != aws.TrueTernary {
			t.Fatalf("the SDK does not classify %v as throttling", err)
		}
	}
	// Another action has its own bucket (EC2 evaluates each API alone).
	assign(t, cliA, a.PrimaryENI.ID, 1)

	// Refill: 10 tokens a second, whole tokens only.
	clock.Advance(time.Second)
	for i := range 10 {
		if err := tag(cliB, b.PrimaryENI.ID); err != nil {
			t.Fatalf("call %d after 1 s of refill: %v", i+1, err)
		}
	}
	wantAPIError(t, tag(cliA, a.PrimaryENI.ID), "RequestLimitExceeded", 503)
	clock.Advance(250 * time.Millisecond) // 2.5 tokens
	for range 2 {
		if err := tag(cliA, a.PrimaryENI.ID); err != nil {
			t.Fatalf("after 250 ms: %v", err)
		}
	}
	wantAPIError(t, tag(cliA, a.PrimaryENI.ID), "RequestLimitExceeded", 503)
	clock.Advance(time.Hour) // never above capacity
	for i := range 100 {
		if err := tag(cliA, a.PrimaryENI.ID); err != nil {
			t.Fatalf("call %d after an idle hour: %v", i+1, err)
		}
	}
	wantAPIError(t, tag(cliA, a.PrimaryENI.ID), "RequestLimitExceeded", 503)

	got := f.RequestCounts()["CreateTags"]
	if want := (vpcsim.RequestCount{Accepted: 212, Throttled: 5}); got != want {
		t.Fatalf("CreateTags counts %+v, want %+v", got, want)
	}
	byCaller := f.RequestCountsByCaller()
	if got, want := byCaller["127.0.0.2"]["CreateTags"], (vpcsim.RequestCount{Accepted: 152, Throttled: 4}); got != want {
		t.Fatalf("caller A: %+v, want %+v", got, want)
	}
	if got, want := byCaller["127.0.0.3"]["CreateTags"], (vpcsim.RequestCount{Accepted: 60, Throttled: 1}); got != want {
		t.Fatalf("caller B: %+v, want %+v", got, want)
	}
}

// TestUnfilteredDescribeBucket: DescribeNetworkInterfaces without a filter
// and without pagination draws from EC2's smaller bucket (50, 10 a second);
// filtered or paginated calls from the action's own (100, 20 a second).
func TestUnfilteredDescribeBucket(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := testConfig()
	cfg.Clock = clock.Now
	l := vpcsimtest.Start(t, cfg)
	l.Cloud.Faults().SetRequestLimits(vpcsim.AWSRequestLimits())
	cli := ec2Client(l)
	unfiltered := func() error {
		_, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{})
		return err
	}
	filtered := func() error {
		_, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{
			Filters: []types.Filter{{Name: aws.String("vpc-id"), Values: []string{l.Cloud.VPCID()}}}})
		return err
	}
	paginated := func() error {
		_, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{MaxResults: aws.Int32(5)})
		return err
	}
	for i := range 50 {
		if err := unfiltered(); err != nil {
			t.Fatalf("unfiltered call %d: %v", i+1, err)
		}
	}
	wantAPIError(t, unfiltered(), "RequestLimitExceeded", 503)
	for i := range 100 {
		call := filtered
		if i%2 == 1 {
			call = paginated
		}
		if err := call(); err != nil {
			t.Fatalf("filtered or paginated call %d: %v", i+1, err)
		}
	}
	wantAPIError(t, filtered(), "RequestLimitExceeded", 503)
	clock.Advance(time.Second)
	for range 10 {
		if err := unfiltered(); err != nil {
			t.Fatal(err)
		}
	}
	wantAPIError(t, unfiltered(), "RequestLimitExceeded", 503)
	got := l.Cloud.Faults().RequestCounts()["DescribeNetworkInterfaces"]
	if want := (vpcsim.RequestCount{Accepted: 160, Throttled: 3}); got != want {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
	// Limits off: no refusals.
	l.Cloud.Faults().SetRequestLimits(nil)
	for range 200 {
		if err := unfiltered(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSDKRetriesThrottledCalls: the SDK's standard retryer retries
// RequestLimitExceeded, each attempt counted as refused.
func TestSDKRetriesThrottledCalls(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := testConfig()
	cfg.Clock = clock.Now
	l := vpcsimtest.Start(t, cfg)
	f := l.Cloud.Faults()
	f.SetRequestLimits(vpcsim.RequestLimits{"CreateTags": {Capacity: 1, RefillPerSecond: 0.001}})
	inst := launchIn(t, l, "m5.large", subnetBig)
	cli := ec2ClientFrom(l, "127.0.0.4", 3)
	if err := tag(cli, inst.PrimaryENI.ID); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := cli.CreateTags(cctx, &ec2.CreateTagsInput{Resources: []string{inst.PrimaryENI.ID}, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
	wantAPIError(t, err, "RequestLimitExceeded", 503)
	if got, want := f.RequestCounts()["CreateTags"], (vpcsim.RequestCount{Accepted: 1, Throttled: 3}); got != want {
		t.Fatalf("counts %+v, want %+v (the SDK retries throttling twice)", got, want)
	}
}

func TestAdminRequestLimitsAndMetrics(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	admin := httptest.NewServer(l.Cloud.AdminHandler())
	t.Cleanup(admin.Close)
	post := func(body string) int {
		t.Helper()
		resp, err := http.Post(admin.URL+"/faults/request-limits", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if code := post(`{"aws":true,"limits":{"AssignPrivateIpAddresses":{"capacity":1,"refillPerSecond":0.001}}}`); code != 200 {
		t.Fatalf("request-limits: HTTP %d", code)
	}
	var limits vpcsim.RequestLimits
	if err := json.Unmarshal([]byte(get("/request-limits")), &limits); err != nil {
		t.Fatal(err)
	}
	if got := limits["AssignPrivateIpAddresses"]; got != (vpcsim.BucketLimit{Capacity: 1, RefillPerSecond: 0.001}) {
		t.Fatalf("override not applied: %+v", got)
	}
	if got := limits["CreateNetworkInterface"]; got != (vpcsim.BucketLimit{Capacity: 100, RefillPerSecond: 5}) {
		t.Fatalf("AWS default not applied: %+v", got)
	}
	// Without "aws", given buckets go over the current set.
	if code := post(`{"limits":{"CreateTags":{"capacity":3,"refillPerSecond":1}}}`); code != 200 {
		t.Fatalf("request-limits: HTTP %d", code)
	}
	limits = nil
	if err := json.Unmarshal([]byte(get("/request-limits")), &limits); err != nil {
		t.Fatal(err)
	}
	if limits["CreateTags"] != (vpcsim.BucketLimit{Capacity: 3, RefillPerSecond: 1}) || limits["AssignPrivateIpAddresses"].Capacity != 1 {
		t.Fatalf("merged limits: %+v", limits)
	}
	assign(t, cli, inst.PrimaryENI.ID, 1)
	wantAPIError(t, assignErr(cli, inst.PrimaryENI.ID, 1), "RequestLimitExceeded", 503)
	metrics := get("/metrics")
	for _, want := range []string{
		`vpcsim_ec2_requests_total{action="AssignPrivateIpAddresses",outcome="accepted"} 1`,
		`vpcsim_ec2_requests_total{action="AssignPrivateIpAddresses",outcome="throttled"} 1`,
		`vpcsim_ec2_bucket_capacity{bucket="AssignPrivateIpAddresses"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, metrics)
		}
	}
	var counts struct {
		ByAction map[string]vpcsim.RequestCount
		ByCaller map[string]map[string]vpcsim.RequestCount
	}
	if err := json.Unmarshal([]byte(get("/requests")), &counts); err != nil {
		t.Fatal(err)
	}
	if got := counts.ByAction["AssignPrivateIpAddresses"]; got != (vpcsim.RequestCount{Accepted: 1, Throttled: 1}) {
		t.Fatalf("/requests: %+v", counts)
	}
	if got := counts.ByCaller["127.0.0.1"]["AssignPrivateIpAddresses"]; got != (vpcsim.RequestCount{Accepted: 1, Throttled: 1}) {
		t.Fatalf("/requests by caller: %+v", counts.ByCaller)
	}
	for _, bad := range []string{
		`{"limits":{"AssignPrivateIpAddresses":{"capacity":-1,"refillPerSecond":1}}}`,
		`{"limits":{"AssignPrivateIpAddresses":{"capacity":1,"refillPerSecond":0}}}`,
		`{"limits":{"NoSuchAction":{"capacity":1,"refillPerSecond":1}}}`,
		`{"aws":true,"off":true}`,
	} {
		if code := post(bad); code != 400 {
			t.Errorf("%s: HTTP %d, want 400", bad, code)
		}
	}
	if code := post(`{"off":true}`); code != 200 {
		t.Fatalf("off: HTTP %d", code)
	}
	assign(t, cli, inst.PrimaryENI.ID, 1)
}

// TestCallerQueueDelaysMutatingCallsInsteadOfRefusing: with one caller
// queue of 10 a second (burst 2) in front of an account bucket of 4 tokens
// refilled at 20 a second, 12 CreateTags from two instances at once all
// succeed, none refused, spread over at least (12-2)/10 s; describes pass
// without waiting; without the queue the same burst is refused.
func TestCallerQueueDelaysMutatingCallsInsteadOfRefusing(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	f := l.Cloud.Faults()
	f.SetRequestLimits(vpcsim.RequestLimits{"CreateTags": {Capacity: 4, RefillPerSecond: 20}})
	a, b := launchIn(t, l, "m5.large", subnetBig), launchIn(t, l, "m5.large", subnetBig)
	cliA, cliB := ec2ClientFrom(l, "127.0.0.2", 1), ec2ClientFrom(l, "127.0.0.3", 1)
	burst := func() (refused int, took time.Duration) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for i := range 12 {
			cli, eni := cliA, a.PrimaryENI.ID
			if i%2 == 1 {
				cli, eni = cliB, b.PrimaryENI.ID
			}
			wg.Go(func() {
				if err := tag(cli, eni); err != nil {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return refused, time.Since(start)
	}

	if refused, _ := burst(); refused == 0 {
		t.Fatal("without a caller queue, 12 calls at once against a bucket of 4: none refused")
	}
	time.Sleep(time.Second) // the account bucket refills
	f.SetCallerQueue(10, 2)
	refused, took := burst()
	if refused != 0 {
		t.Fatalf("with the caller queue: %d of 12 calls refused", refused)
	}
	if took < 900*time.Millisecond {
		t.Fatalf("12 calls through a queue of 10/s, burst 2, took %s: want at least 1 s", took)
	}
	start := time.Now()
	for range 6 {
		if _, err := cliA.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{}); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Fatalf("6 describes took %s behind the caller queue: describes should not wait in it", d)
	}
}
