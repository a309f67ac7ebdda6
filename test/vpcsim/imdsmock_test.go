package vpcsim_test

import (
	"encoding/json"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/aws/amazon-ec2-metadata-mock/pkg/config/defaults"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// shapeOf classifies an IMDS value by form, so that values of two
// simulators can be compared without being equal.
func shapeOf(v string) string {
	shapes := []struct{ name, re string }{
		{"mac", `^([0-9a-f]{2}:){5}[0-9a-f]{2}$`},
		{"hostname", `^ip-\d+-\d+-\d+-\d+\.[a-z0-9.-]*internal$`},
		{"availability zone", `^[a-z]{2}-[a-z]+-\d[a-z]$`},
		{"region", `^[a-z]{2}-[a-z]+-\d$`},
		{"number", `^\d+$`},
		{"instance type", `^[a-z][a-z0-9-]*\.[a-z0-9-]+$`},
		{"resource id", `^(ami|i|eni|subnet|vpc|sg)-[0-9a-f]+$`},
	}
	if a, err := netip.ParseAddr(v); err == nil && a.Is4() {
		return "ipv4"
	}
	if p, err := netip.ParsePrefix(v); err == nil && p.Addr().Is4() {
		return "ipv4 cidr"
	}
	for _, s := range shapes {
		if regexp.MustCompile(s.re).MatchString(v) {
			if s.name == "resource id" {
				return s.name + " " + v[:strings.Index(v, "-")]
			}
			return s.name
		}
	}
	return "text"
}

// TestIMDSShapesMatchAWSMock compares, for one instance with one ENI, the
// metadata paths and value forms vpcsim serves with those of AWS's own IMDS
// simulator (amazon-ec2-metadata-mock's default metadata).
func TestIMDSShapesMatchAWSMock(t *testing.T) {
	var mock struct {
		Metadata struct {
			Paths  map[string]string `json:"paths"`
			Values map[string]any    `json:"values"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(defaults.GetDefaultValues(), &mock); err != nil {
		t.Fatal(err)
	}
	mockMAC, _ := mock.Metadata.Values["mac"].(string)
	if mockMAC == "" {
		t.Fatal("the mock's defaults have no mac")
	}

	l := vpcsimtest.Start(t, vpcsim.Config{})
	inst := l.Launch(t, "m5.large")
	md := imdsClient(l, inst.ID)

	// The paths vpcip reads or that describe the instance and its ENI; the
	// rest of the mock's (public addresses, IPv6, IAM, events, block
	// devices) are outside vpcsim's VPC.
	keys := []string{
		"ami-id", "instance-id", "instance-type", "local-ipv4", "local-hostname", "hostname", "mac",
		"placement-availability-zone", "placement-region", "services-domain", "security-groups",
		"mac-device-number", "mac-local-hostname", "mac-local-ipv4s", "mac-mac", "mac-network-interface-id",
		"mac-owner-id", "mac-security-group-ids", "mac-security-groups", "mac-subnet-id",
		"mac-subnet-ipv4-cidr-block", "mac-vpc-id", "mac-vpc-ipv4-cidr-block", "mac-vpc-ipv4-cidr-blocks",
	}
	for _, key := range keys {
		mockPath, ok := mock.Metadata.Paths[key]
		if !ok {
			t.Errorf("the mock has no %s", key)
			continue
		}
		mockValue, _ := mock.Metadata.Values[key].(string)
		path := strings.TrimPrefix(strings.ReplaceAll(mockPath, mockMAC, inst.PrimaryENI.MAC), "/latest/meta-data/")
		got := imdsGet(t, md, path)
		if strings.Contains(got, "\n") || strings.Contains(mockValue, "\n") {
			t.Errorf("%s: one ENI, one address: want one line, got %q (mock %q)", path, got, mockValue)
		}
		if key == "security-groups" || key == "mac-security-groups" {
			continue // group names are free text
		}
		if g, m := shapeOf(got), shapeOf(mockValue); g != m {
			t.Errorf("%s: vpcsim %q is a %s, the mock's %q a %s", path, got, g, mockValue, m)
		}
	}
	// The mock names the network card "network-card-index"; EC2's
	// documented category, which vpcsim serves, is "network-card".
	if got := imdsGet(t, md, "network/interfaces/macs/"+inst.PrimaryENI.MAC+"/network-card"); got != "0" {
		t.Errorf("network-card: %q", got)
	}
}
