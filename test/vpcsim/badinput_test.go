package vpcsim_test

import (
	"bytes"
	"compress/gzip"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// errorShape is EC2's error reply, element for element.
var errorShape = regexp.MustCompile(`^<\?xml version="1.0" encoding="UTF-8"\?>\n<Response><Errors><Error><Code>[A-Za-z.]+</Code><Message>[^<]*</Message></Error></Errors><RequestID>[0-9a-f-]{36}</RequestID></Response>$`)

func post(h http.Handler, method, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestBadInputGetsEC2ErrorShape(t *testing.T) {
	c, err := vpcsim.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := c.LaunchInstance("m5.large", "")
	if err != nil {
		t.Fatal(err)
	}
	eni := "NetworkInterfaceId=" + inst.PrimaryENI.ID
	v := "&Version=2016-11-15"
	tests := []struct {
		name, method, body, code string
	}{
		{"no action", "POST", "Version=2016-11-15", "MissingAction"},
		{"unknown action", "POST", "Action=RunInstances" + v, "InvalidAction"},
		{"no version", "POST", "Action=DescribeSubnets", "MissingParameter"},
		{"wrong version", "POST", "Action=DescribeSubnets&Version=2014-01-01", "NoSuchVersion"},
		{"missing parameter", "POST", "Action=AssignPrivateIpAddresses&SecondaryPrivateIpAddressCount=1" + v, "MissingParameter"},
		{"missing device index", "POST", "Action=AttachNetworkInterface&" + eni + "&InstanceId=" + inst.ID + v, "MissingParameter"},
		{"count not a number", "POST", "Action=AssignPrivateIpAddresses&" + eni + "&SecondaryPrivateIpAddressCount=lots" + v, "InvalidParameterValue"},
		{"count zero", "POST", "Action=AssignPrivateIpAddresses&" + eni + "&SecondaryPrivateIpAddressCount=0" + v, "InvalidParameterValue"},
		{"count huge", "POST", "Action=AssignPrivateIpAddresses&" + eni + "&SecondaryPrivateIpAddressCount=99999999999999999999" + v, "InvalidParameterValue"},
		{"bad address", "POST", "Action=AssignPrivateIpAddresses&" + eni + "&PrivateIpAddress.1=300.1.1.1" + v, "InvalidParameterValue"},
		{"IPv6 address", "POST", "Action=AssignPrivateIpAddresses&" + eni + "&PrivateIpAddress.1=fe80::1" + v, "InvalidParameterValue"},
		{"bad prefix", "POST", "Action=UnassignPrivateIpAddresses&" + eni + "&Ipv4Prefix.1=x/28" + v, "InvalidParameterValue"},
		{"bad list index", "POST", "Action=DescribeNetworkInterfaces&NetworkInterfaceId.x=eni-1" + v, "InvalidParameterValue"},
		{"zero list index", "POST", "Action=DescribeNetworkInterfaces&Filter.0.Name=status" + v, "InvalidParameterValue"},
		{"filter without name", "POST", "Action=DescribeNetworkInterfaces&Filter.1.Value.1=x" + v, "MissingParameter"},
		{"MaxResults negative", "POST", "Action=DescribeNetworkInterfaces&MaxResults=-1" + v, "InvalidParameterValue"},
		{"bad boolean", "POST", "Action=DescribeSubnets&DryRun=perhaps" + v, "InvalidParameterValue"},
		{"bad tag resource type", "POST", "Action=CreateNetworkInterface&SubnetId=" + subnetBig + "&TagSpecification.1.ResourceType=instance&TagSpecification.1.Tag.1.Key=a" + v, "InvalidParameterValue"},
		{"tag without key", "POST", "Action=CreateTags&ResourceId.1=" + inst.ID + "&Tag.1.Value=a" + v, "MissingParameter"},
		{"unknown resource kind", "POST", "Action=CreateTags&ResourceId.1=ami-1&Tag.1.Key=a" + v, "InvalidID"},
		{"malformed form", "POST", "Action=DescribeSubnets&%zz" + v, "MalformedQueryString"},
		{"too large", "POST", "Action=DescribeSubnets" + v + "&Pad=" + strings.Repeat("x", 2<<20), "MalformedQueryString"},
		{"wrong method", "DELETE", "", "InvalidHttpRequest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snap(c)
			rec := post(c.EC2Handler(), tt.method, tt.body)
			if rec.Code != 400 {
				t.Errorf("HTTP %d, want 400", rec.Code)
			}
			if !errorShape.MatchString(rec.Body.String()) {
				t.Fatalf("reply is not EC2's error shape: %q", rec.Body.String())
			}
			var e struct {
				Code string `xml:"Errors>Error>Code"`
			}
			if err := xml.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code != tt.code {
				t.Fatalf("code %q (%v), want %s", e.Code, err, tt.code)
			}
			sameSnapshot(t, before, snap(c))
		})
	}
}

// FuzzEC2Request feeds arbitrary form bodies to the EC2 handler. Every reply
// must be well-formed XML, either an <ActionResponse> or EC2's error shape,
// never an internal error (a recovered panic), and the model's invariants
// must hold afterwards.
func FuzzEC2Request(f *testing.F) {
	for _, seed := range []string{
		"Action=DescribeNetworkInterfaces&Version=2016-11-15&Filter.1.Name=status&Filter.1.Value.1=in-use&MaxResults=5",
		"Action=CreateNetworkInterface&Version=2016-11-15&SubnetId=" + subnetBig + "&SecondaryPrivateIpAddressCount=2&TagSpecification.1.ResourceType=network-interface&TagSpecification.1.Tag.1.Key=k&TagSpecification.1.Tag.1.Value=v",
		"Action=AssignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=eni-1&Ipv4Prefix.1=100.64.1.16/28",
		"Action=UnassignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=eni-1&PrivateIpAddress.1=100.64.0.9",
		"Action=DescribeInstanceTypes&Version=2016-11-15&InstanceType.1=m5.large&Filter.1.Name=hypervisor&Filter.1.Value.1=n*o",
		"Action=DeleteTags&Version=2016-11-15&ResourceId.1=" + subnetBig + "&Tag.1.Key=a&Tag.1.Value=",
		"Action=DescribeSubnets&Version=2016-11-15&NextToken=c3VibmV0LTA",
		"Action=AttachNetworkInterface&Version=2016-11-15&NetworkInterfaceId=eni-1&InstanceId=i-1&DeviceIndex=1&NetworkCardIndex=3",
		"Action=ModifyNetworkInterfaceAttribute&Version=2016-11-15&NetworkInterfaceId=eni-1&SecurityGroupId.1=sg-1",
		"Action=TerminateInstances&Version=2016-11-15&InstanceId.1=i-1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		// A fresh cloud per input keeps runs deterministic and fast.
		c, err := vpcsim.New(testConfig())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.LaunchInstance("m5.large", ""); err != nil {
			t.Fatal(err)
		}
		rec := post(c.EC2Handler(), "POST", body)
		out := rec.Body.String()
		if rec.Code == http.StatusOK {
			if !strings.Contains(out, `Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>`) {
				t.Fatalf("success reply without EC2's envelope: %q", out)
			}
		} else if !errorShape.MatchString(out) || strings.Contains(out, "<Code>InternalError</Code>") {
			t.Fatalf("HTTP %d reply %q", rec.Code, out)
		}
		d := xml.NewDecoder(strings.NewReader(out))
		for {
			if _, err := d.Token(); err != nil {
				if err.Error() != "EOF" {
					t.Fatalf("reply is not well-formed XML (%v): %q", err, out)
				}
				break
			}
		}
		if err := invariants(c); err != nil {
			t.Fatalf("after %q: %v", body, err)
		}
	})
}

// TestLargeRepliesAreCompressed: a large reply is gzipped for a client that
// accepts it (so that it reaches the SDK in one read) and plain otherwise.
func TestLargeRepliesAreCompressed(t *testing.T) {
	c, err := vpcsim.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, gz := range []bool{true, false} {
		req := httptest.NewRequest("POST", "/", strings.NewReader("Action=DescribeInstanceTypes&Version=2016-11-15"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if gz {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		rec := httptest.NewRecorder()
		c.EC2Handler().ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		if got := rec.Header().Get("Content-Encoding") == "gzip"; got != gz {
			t.Fatalf("Accept-Encoding gzip %v: Content-Encoding %q", gz, rec.Header().Get("Content-Encoding"))
		}
		if rec.Header().Get("Content-Length") != fmt.Sprint(len(body)) {
			t.Fatalf("Content-Length %s for %d bytes", rec.Header().Get("Content-Length"), len(body))
		}
		if gz {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
			if n := rec.Body.Len(); n > 3500 {
				t.Errorf("a 100-type page compresses to %d bytes, more than fits the client's first read", n)
			}
		}
		if !bytes.Contains(body, []byte("<instanceType>a1.2xlarge</instanceType>")) {
			t.Fatalf("reply lacks the first type: %.200s", body)
		}
	}
}
