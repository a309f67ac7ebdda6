package vpcsim_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

func TestFaultLatency(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	l.Cloud.Faults().SetLatency("DescribeSubnets", 40*time.Millisecond, 10*time.Millisecond)
	start := time.Now()
	if _, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Fatalf("DescribeSubnets took %v, injected latency is at least 40ms", d)
	}
	// A caller that gives up does not wait for the injected latency.
	l.Cloud.Faults().SetLatency(vpcsim.AnyOp, time.Hour, 0)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := cli.DescribeNetworkInterfaces(cctx, &ec2.DescribeNetworkInterfacesInput{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the caller's deadline", err)
	}
	if n := l.Cloud.Faults().Calls("DescribeNetworkInterfaces"); n != 1 {
		t.Fatalf("calls counted: %d, want 1", n)
	}
}

func TestFaultErrorRateAndFailNext(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	f := l.Cloud.Faults()

	f.SetErrorRate("AssignPrivateIpAddresses", 1, "InsufficientFreeAddressesInSubnet")
	for range 5 {
		wantAPIError(t, assignErr(cli, inst.PrimaryENI.ID, 1), "InsufficientFreeAddressesInSubnet", 400)
	}
	if e := mustENI(t, l.Cloud, inst.PrimaryENI.ID); len(e.SecondaryIPs) != 0 {
		t.Fatalf("an injected failure assigned %v", e.SecondaryIPs)
	}
	f.SetErrorRate("AssignPrivateIpAddresses", 0, "")
	assign(t, cli, inst.PrimaryENI.ID, 1)

	// A rate of one half fails some of many calls and lets others through.
	f.SetErrorRate(vpcsim.AnyOp, 0.5, "InternalError")
	failed := 0
	for range 40 {
		if _, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{}); err != nil {
			wantAPIError(t, err, "InternalError", 500)
			failed++
		}
	}
	if failed == 0 || failed == 40 {
		t.Fatalf("rate 0.5 failed %d of 40 calls", failed)
	}
	f.SetErrorRate(vpcsim.AnyOp, 0, "")

	f.FailNext("AttachNetworkInterface", "AttachmentLimitExceeded")
	f.FailNext("AttachNetworkInterface", "UnauthorizedOperation")
	eni := createENI(t, cli, subnetBig)
	attachErr := func() error {
		_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1)})
		return err
	}
	wantAPIError(t, attachErr(), "AttachmentLimitExceeded", 400)
	wantAPIError(t, attachErr(), "UnauthorizedOperation", 403)
	if err := attachErr(); err != nil {
		t.Fatalf("third attach after two one-shot failures: %v", err)
	}
	if e := mustENI(t, l.Cloud, eni); e.InstanceID != inst.ID {
		t.Fatalf("ENI not attached: %+v", e)
	}
	if n := f.Calls("AttachNetworkInterface"); n != 3 {
		t.Fatalf("AttachNetworkInterface calls: %d, want 3", n)
	}
}

func TestThrottleBucketsAreSeparate(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	f := l.Cloud.Faults()
	f.SetThrottle(true, 0.001, 3)
	for range 3 {
		assign(t, cli, inst.PrimaryENI.ID, 1)
	}
	wantAPIError(t, assignErr(cli, inst.PrimaryENI.ID, 1), "RequestLimitExceeded", 503)
	if e := mustENI(t, l.Cloud, inst.PrimaryENI.ID); len(e.SecondaryIPs) != 3 {
		t.Fatalf("secondaries %d, want 3 (the throttled call must not assign)", len(e.SecondaryIPs))
	}
	// Describe calls draw from their own bucket.
	for range 5 {
		if _, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{}); err != nil {
			t.Fatalf("describe throttled by the mutating bucket: %v", err)
		}
	}
	f.SetThrottle(false, 0.001, 1)
	if _, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{}); err != nil {
		t.Fatal(err)
	}
	_, err := cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
	wantAPIError(t, err, "RequestLimitExceeded", 503)
	if n := f.Calls("AssignPrivateIpAddresses"); n != 4 {
		t.Fatalf("assign calls %d, want 4 (throttled ones count)", n)
	}
	f.Reset()
	if f.Calls("AssignPrivateIpAddresses") != 0 {
		t.Fatal("Reset kept the counters")
	}
	assign(t, cli, inst.PrimaryENI.ID, 1)
}

func TestAdminHandler(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	admin := httptest.NewServer(l.Cloud.AdminHandler())
	t.Cleanup(admin.Close)
	post := func(path, body string) int {
		t.Helper()
		resp, err := http.Post(admin.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/faults/fail-next", `{"op":"AssignPrivateIpAddresses","code":"InsufficientFreeAddressesInSubnet"}`); code != 200 {
		t.Fatalf("fail-next: HTTP %d", code)
	}
	wantAPIError(t, assignErr(cli, inst.PrimaryENI.ID, 1), "InsufficientFreeAddressesInSubnet", 400)
	if code := post("/faults/throttle", `{"mutating":true,"perSecond":0.001,"burst":1}`); code != 200 {
		t.Fatalf("throttle: HTTP %d", code)
	}
	assign(t, cli, inst.PrimaryENI.ID, 1)
	wantAPIError(t, assignErr(cli, inst.PrimaryENI.ID, 1), "RequestLimitExceeded", 503)
	if code := post("/faults/latency", `{"op":"DescribeSubnets","fixed":"1ms"}`); code != 200 {
		t.Fatalf("latency: HTTP %d", code)
	}
	if code := post("/faults/imds-lag", `{"lag":"2s"}`); code != 200 || l.Cloud.Faults().IMDSLag() != 2*time.Second {
		t.Fatalf("imds-lag: HTTP %d, lag %v", code, l.Cloud.Faults().IMDSLag())
	}
	if code := post("/faults/describe-lag", `{"lag":"0s"}`); code != 200 {
		t.Fatalf("describe-lag: HTTP %d", code)
	}
	l.Cloud.Faults().SetIMDSLag(0)
	if code := post("/faults/imds-override", `{"instanceId":"`+inst.ID+`","path":"meta-data/instance-type","value":"t3.nano"}`); code != 200 {
		t.Fatalf("imds-override: HTTP %d", code)
	}
	if got := imdsGet(t, imdsClient(l, inst.ID), "instance-type"); got != "t3.nano" {
		t.Fatalf("overridden instance-type %q", got)
	}
	for _, bad := range []struct{ path, body string }{
		{"/faults/latency", `{"op":"X","fixed":"soon"}`},
		{"/faults/error-rate", `{"op":"X","rate":2,"code":"InternalError"}`},
		{"/faults/fail-next", `{"op":"X"}`},
		{"/faults/throttle", `{"perSecond":-1}`},
		{"/faults/imds-lag", `{"lag":"2s","extra":1}`},
		{"/faults/latency", `not json`},
		{"/faults/imds-override", `{"path":"meta-data/mac"}`},
	} {
		if code := post(bad.path, bad.body); code != 400 {
			t.Errorf("%s %s: HTTP %d, want 400", bad.path, bad.body, code)
		}
	}
	resp, err := http.Get(admin.URL + "/calls")
	if err != nil {
		t.Fatal(err)
	}
	var calls map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls["AssignPrivateIpAddresses"] != 3 {
		t.Fatalf("calls: %v", calls)
	}
	resp, err = http.Get(admin.URL + "/state")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), inst.PrimaryENI.ID) {
		t.Fatalf("state lacks the instance's ENI: %s", body)
	}
	if code := post("/faults/reset", ``); code != 200 {
		t.Fatalf("reset: HTTP %d", code)
	}
	assign(t, cli, inst.PrimaryENI.ID, 1)
}

func TestDescribeLag(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	l.Cloud.Faults().SetDescribeLag(time.Hour)
	eni := createENI(t, cli, subnetBig)
	_, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}})
	wantAPIError(t, err, "InvalidNetworkInterfaceID.NotFound", 400)
	assign(t, cli, inst.PrimaryENI.ID, 2)
	out, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.NetworkInterfaces) != 1 || len(out.NetworkInterfaces[0].PrivateIpAddresses) != 1 {
		t.Fatalf("lagging describe shows the new state: %+v", out.NetworkInterfaces)
	}
	// The model itself is current; only the describe lags.
	if e := mustENI(t, l.Cloud, inst.PrimaryENI.ID); len(e.SecondaryIPs) != 2 {
		t.Fatalf("model secondaries %v", e.SecondaryIPs)
	}
	l.Cloud.Faults().SetDescribeLag(0)
	out, err = cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{})
	if err != nil || len(out.NetworkInterfaces) != 2 {
		t.Fatalf("describe without lag: %v %v", out, err)
	}
}

func TestIMDSOverrides(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := createENI(t, cli, subnetBig)
	attach(t, cli, eni, inst.ID, 1)
	mac := mustENI(t, l.Cloud, eni).MAC
	md := imdsClient(l, inst.ID)
	f := l.Cloud.Faults()
	path := "meta-data/network/interfaces/macs/" + inst.PrimaryENI.MAC + "/local-ipv4s"
	f.SetIMDSOverride(inst.ID, path, "100.64.0.250")
	if got := imdsGet(t, md, "network/interfaces/macs/"+inst.PrimaryENI.MAC+"/local-ipv4s"); got != "100.64.0.250" {
		t.Fatalf("override: %q", got)
	}
	f.HideIMDS(inst.ID, "meta-data/network/interfaces/macs/"+mac)
	if macs := imdsGet(t, md, "network/interfaces/macs/"); strings.Contains(macs, mac) {
		t.Fatalf("hidden MAC listed: %q", macs)
	}
	if _, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: "network/interfaces/macs/" + mac + "/interface-id"}); err == nil {
		t.Fatal("hidden path answered")
	}
	f.ClearIMDSOverrides(inst.ID)
	if got := imdsGet(t, md, "network/interfaces/macs/"+mac+"/interface-id"); got != eni {
		t.Fatalf("after clearing: %q", got)
	}
}
