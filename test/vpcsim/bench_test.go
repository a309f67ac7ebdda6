package vpcsim_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// benchNode is a node as the daemon sees it: an m5.large with three ENIs of
// ten addresses each, among twenty other instances.
func benchNode(b *testing.B) (*vpcsimtest.Local, vpcsim.InstanceInfo) {
	l := vpcsimtest.Start(b, vpcsim.Config{Seed: 3})
	for range 20 {
		inst := l.Launch(b, "m5.large")
		if _, err := l.Cloud.LaunchInstance("m5.large", inst.SubnetID); err != nil {
			b.Fatal(err)
		}
	}
	inst := l.Launch(b, "m5.large")
	cli := ec2Client(l)
	for dev := int32(1); dev <= 2; dev++ {
		out, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(inst.SubnetID), SecondaryPrivateIpAddressCount: aws.Int32(9)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: out.NetworkInterface.NetworkInterfaceId, InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(dev)}); err != nil {
			b.Fatal(err)
		}
	}
	return l, inst
}

// BenchmarkHandler measures the simulator's own work per call: parsing,
// the model, and the XML reply, with no network.
func BenchmarkHandler(b *testing.B) {
	l, inst := benchNode(b)
	h := l.Cloud.EC2Handler()
	describe := "Action=DescribeNetworkInterfaces&Version=2016-11-15&Filter.1.Name=attachment.instance-id&Filter.1.Value.1=" + inst.ID
	assign := "Action=AssignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=" + inst.PrimaryENI.ID + "&PrivateIpAddress.1=100.64.9.9"
	unassign := "Action=UnassignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=" + inst.PrimaryENI.ID + "&PrivateIpAddress.1=100.64.9.9"
	b.Run("DescribeNetworkInterfaces", func(b *testing.B) {
		for b.Loop() {
			if rec := post(h, "POST", describe); rec.Code != 200 {
				b.Fatal(rec.Body.String())
			}
		}
	})
	b.Run("AssignUnassignPair", func(b *testing.B) {
		for b.Loop() {
			if rec := post(h, "POST", assign); rec.Code != 200 {
				b.Fatal(rec.Body.String())
			}
			if rec := post(h, "POST", unassign); rec.Code != 200 {
				b.Fatal(rec.Body.String())
			}
		}
	})
}

// BenchmarkLoopback measures a whole call over loopback HTTP: raw, and
// through aws-sdk-go-v2 (whose own signing and XML decoding dominate).
func BenchmarkLoopback(b *testing.B) {
	l, inst := benchNode(b)
	form := url.Values{"Action": {"DescribeNetworkInterfaces"}, "Version": {"2016-11-15"},
		"Filter.1.Name": {"attachment.instance-id"}, "Filter.1.Value.1": {inst.ID}}.Encode()
	client := &http.Client{}
	b.Run("RawHTTP", func(b *testing.B) {
		for b.Loop() {
			resp, err := client.Post(l.EC2URL, "application/x-www-form-urlencoded", strings.NewReader(form))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatal(resp.Status)
			}
		}
	})
	cli := ec2Client(l)
	in := &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{inst.ID}}}}
	b.Run("SDK", func(b *testing.B) {
		for b.Loop() {
			out, err := cli.DescribeNetworkInterfaces(ctx, in)
			if err != nil || len(out.NetworkInterfaces) != 3 {
				b.Fatal(err)
			}
		}
	})
}
