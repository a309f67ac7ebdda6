package vpcsim_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestFreePrefixesFollowAlignedBlocks checks the model's count of whole
// aligned /28s (SubnetInfo.FreePrefixes) as single addresses break blocks
// and leave them, and that a prefix assignment needs a whole block:
// subnetFrag (100.64.16.64/26) has /28s at .64 (reserved addresses and the
// primary), .80, .96 and .112 (broadcast), so two can ever be whole.
func TestFreePrefixesFollowAlignedBlocks(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetFrag)
	eni := inst.PrimaryENI.ID
	free := func() int { return mustSubnet(t, l.Cloud, subnetFrag).FreePrefixes }
	if got := free(); got != 2 {
		t.Fatalf("fresh subnet: %d whole /28s, want 2 (.80 and .96)", got)
	}
	assignExplicit(t, cli, eni, "100.64.16.85")
	if got := free(); got != 1 {
		t.Fatalf("one address in .80/28: %d whole /28s, want 1", got)
	}
	// A second address in the already broken block costs no whole /28.
	assignExplicit(t, cli, eni, "100.64.16.86")
	if got := free(); got != 1 {
		t.Fatalf("two addresses in .80/28: %d whole /28s, want 1", got)
	}
	// A prefix takes the only whole block, .96/28; the next is refused.
	out, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), Ipv4PrefixCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.AssignedIpv4Prefixes) != 1 || aws.ToString(out.AssignedIpv4Prefixes[0].Ipv4Prefix) != "100.64.16.96/28" {
		t.Fatalf("prefix assigned = %+v, want 100.64.16.96/28", out.AssignedIpv4Prefixes)
	}
	_, err = cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), Ipv4PrefixCount: aws.Int32(1)})
	wantAPIError(t, err, "InsufficientCidrBlocks", 400)
	// Releasing both single addresses makes .80/28 whole again.
	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: []string{"100.64.16.85", "100.64.16.86"}}); err != nil {
		t.Fatal(err)
	}
	if got := free(); got != 1 {
		t.Fatalf("after the release: %d whole /28s, want 1 (.80; .96 is the prefix)", got)
	}
	if _, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), Ipv4PrefixCount: aws.Int32(1)}); err != nil {
		t.Fatalf("prefix once .80/28 is whole again: %v", err)
	}
	if got := free(); got != 0 {
		t.Fatalf("both /28s delegated: %d whole /28s, want 0", got)
	}
}

// TestNamedAddressHeldElsewhere checks EC2's answer to naming an address
// another ENI holds: InvalidParameterValue, HTTP 400, and nothing assigned.
func TestNamedAddressHeldElsewhere(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	a := launchIn(t, l, "m5.large", subnetBig)
	b := launchIn(t, l, "m5.large", subnetBig)
	assignExplicit(t, cli, a.PrimaryENI.ID, "100.64.0.40")
	err := assignExplicitErr(cli, b.PrimaryENI.ID, "100.64.0.41", "100.64.0.40")
	wantAPIError(t, err, "InvalidParameterValue", 400)
	if got := mustENI(t, l.Cloud, b.PrimaryENI.ID).SecondaryIPs; len(got) != 0 {
		t.Fatalf("refused request left %v on the ENI", got)
	}
	assignExplicit(t, cli, b.PrimaryENI.ID, "100.64.0.41") // .41 was given back
}

// TestScatterAddresses checks Config.ScatterAddresses: EC2's own choice
// spreads over the subnet (not the lowest free addresses), is repeatable
// with a seed, and never hands out a held or reserved address.
func TestScatterAddresses(t *testing.T) {
	run := func() []string {
		cfg := testConfig()
		cfg.ScatterAddresses = true
		l := vpcsimtest.Start(t, cfg)
		cli := ec2Client(l)
		inst := launchIn(t, l, "m5.large", subnetBig)
		out, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), SecondaryPrivateIpAddressCount: aws.Int32(9)})
		if err != nil {
			t.Fatal(err)
		}
		got := []string{inst.PrimaryENI.PrimaryIP.String()}
		for _, a := range out.AssignedPrivateIpAddresses {
			got = append(got, aws.ToString(a.PrivateIpAddress))
		}
		return got
	}
	a, b := run(), run()
	if len(a) != 10 || !slicesEqual(a, b) {
		t.Fatalf("seeded scatter not repeatable: %v vs %v", a, b)
	}
	blocks := map[string]bool{}
	for _, s := range a {
		ip := addrs([]string{s})[0]
		o := ip.As4()
		if o[2] == 0 && o[3] < 4 || o[2] == 15 && o[3] == 255 {
			t.Fatalf("reserved address %s handed out", s)
		}
		o[3] &^= 15
		blocks[string(o[:])] = true
	}
	if len(blocks) < 5 {
		t.Fatalf("10 scattered addresses fall in only %d /28s: %v", len(blocks), a)
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
