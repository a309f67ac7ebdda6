package vpcsim_test

import (
	"net/netip"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

const (
	subnetBig  = "subnet-0000000000000000a" // 100.64.0.0/20, us-west-2a
	subnetTiny = "subnet-0000000000000000b" // 100.64.16.0/27, us-west-2a: 27 usable
	subnetFrag = "subnet-0000000000000000c" // 100.64.16.64/26, us-west-2a: two /28s free of reserved addresses
	subnetB    = "subnet-0000000000000000d" // 100.64.32.0/20, us-west-2b
)

func testConfig() vpcsim.Config {
	return vpcsim.Config{Seed: 7, Subnets: []vpcsim.SubnetSpec{
		{ID: subnetBig, CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a"},
		{ID: subnetTiny, CIDR: netip.MustParsePrefix("100.64.16.0/27"), AvailabilityZone: "us-west-2a"},
		{ID: subnetFrag, CIDR: netip.MustParsePrefix("100.64.16.64/26"), AvailabilityZone: "us-west-2a"},
		{ID: subnetB, CIDR: netip.MustParsePrefix("100.64.32.0/20"), AvailabilityZone: "us-west-2b", Tags: map[string]string{"tier": "b"}},
	}}
}

func launchIn(t *testing.T, l *vpcsimtest.Local, typ, subnet string) vpcsim.InstanceInfo {
	t.Helper()
	inst, err := l.Cloud.LaunchInstance(typ, subnet)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func createENI(t *testing.T, cli *ec2.Client, subnet string) string {
	t.Helper()
	out, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnet)})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.NetworkInterface.NetworkInterfaceId)
}

// snapshot is the part of the model a refused call must leave unchanged.
type snapshot struct {
	enis []vpcsim.ENIInfo
	free map[string]int
}

func snap(c *vpcsim.Cloud) snapshot {
	s := snapshot{enis: c.NetworkInterfaces(), free: map[string]int{}}
	for _, sn := range c.Subnets() {
		s.free[sn.ID] = sn.FreeAddresses
	}
	return s
}

func sameSnapshot(t *testing.T, before, after snapshot) {
	t.Helper()
	if len(before.enis) != len(after.enis) {
		t.Fatalf("ENI count changed: %d → %d", len(before.enis), len(after.enis))
	}
	for i := range before.enis {
		b, a := before.enis[i], after.enis[i]
		if b.ID != a.ID || b.Status != a.Status || len(b.SecondaryIPs) != len(a.SecondaryIPs) || len(b.Prefixes) != len(a.Prefixes) || b.InstanceID != a.InstanceID {
			t.Fatalf("ENI changed by a refused call:\n before %+v\n after  %+v", b, a)
		}
	}
	for id, f := range before.free {
		if after.free[id] != f {
			t.Fatalf("subnet %s free count changed by a refused call: %d → %d", id, f, after.free[id])
		}
	}
}

// TestRefusals checks every EC2 refusal the simulator models: the code, the
// HTTP status, and that the model did not change.
func TestRefusals(t *testing.T) {
	tests := []struct {
		name   string
		code   string
		status int
		// setup prepares state and returns the refused call.
		setup func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error
	}{
		{"ENIs per instance", "AttachmentLimitExceeded", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "t3.nano", subnetBig) // 2 ENIs
			if _, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(createENI(t, cli, subnetBig)), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1)}); err != nil {
				t.Fatal(err)
			}
			third := createENI(t, cli, subnetBig)
			return func() error {
				_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(third), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(2)})
				return err
			}
		}},
		{"addresses per ENI", "PrivateIpAddressLimitExceeded", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig) // 10 per ENI
			assign(t, cli, inst.PrimaryENI.ID, 9)
			return func() error { return assignErr(cli, inst.PrimaryENI.ID, 1) }
		}},
		{"prefixes share the per-ENI slots", "PrivateIpAddressLimitExceeded", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			assign(t, cli, inst.PrimaryENI.ID, 5)
			assignPrefixes(t, cli, inst.PrimaryENI.ID, 4) // 1 + 5 + 4 = 10
			return func() error {
				_, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv4PrefixCount: aws.Int32(1)})
				return err
			}
		}},
		{"subnet out of addresses", "InsufficientFreeAddressesInSubnet", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "c5.18xlarge", subnetTiny) // 27 usable, 1 taken
			assign(t, cli, inst.PrimaryENI.ID, 25)
			return func() error { return assignErr(cli, inst.PrimaryENI.ID, 2) }
		}},
		{"no aligned /28 left (fragmentation)", "InsufficientCidrBlocks", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetFrag) // takes 100.64.16.68
			// One address in each of the /28s .80-.95 and .96-.111 leaves no
			// free aligned /28: .64-.79 holds the reserved addresses and the
			// primary, .112-.127 the broadcast address.
			assignExplicit(t, cli, inst.PrimaryENI.ID, "100.64.16.85", "100.64.16.100")
			if f := mustSubnet(t, l.Cloud, subnetFrag).FreeAddresses; f < 16 {
				t.Fatalf("setup: only %d free, want ≥ 16 so that only alignment fails", f)
			}
			return func() error {
				_, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv4PrefixCount: aws.Int32(1)})
				return err
			}
		}},
		{"unknown ENI", "InvalidNetworkInterfaceID.NotFound", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			return func() error {
				_, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{"eni-0123456789abcdef0"}})
				return err
			}
		}},
		{"delete while attached", "InvalidNetworkInterface.InUse", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID)})
				return err
			}
		}},
		{"address held by another ENI", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			b := launchIn(t, l, "m5.large", subnetBig)
			return func() error { return assignExplicitErr(cli, b.PrimaryENI.ID, a.PrimaryENI.PrimaryIP.String()) }
		}},
		{"address outside the subnet", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			return func() error { return assignExplicitErr(cli, a.PrimaryENI.ID, "100.64.40.9") }
		}},
		{"reserved address", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			return func() error { return assignExplicitErr(cli, a.PrimaryENI.ID, "100.64.0.3") }
		}},
		{"prefixes on a Xen type", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m4.large", subnetBig)
			return func() error {
				_, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(a.PrimaryENI.ID), Ipv4PrefixCount: aws.Int32(1)})
				return err
			}
		}},
		{"unknown instance", "InvalidInstanceID.NotFound", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			eni := createENI(t, cli, subnetBig)
			return func() error {
				_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String("i-0123456789abcdef0"), DeviceIndex: aws.Int32(1)})
				return err
			}
		}},
		{"throttled", "RequestLimitExceeded", 503, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			a := launchIn(t, l, "m5.large", subnetBig)
			l.Cloud.Faults().SetThrottle(true, 0.001, 1)
			assign(t, cli, a.PrimaryENI.ID, 1) // takes the only token
			return func() error { return assignErr(cli, a.PrimaryENI.ID, 1) }
		}},
		{"not authorized", "UnauthorizedOperation", 403, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			eni := createENI(t, cli, subnetBig)
			l.Cloud.Faults().FailNext("DeleteNetworkInterface", "UnauthorizedOperation")
			return func() error {
				_, err := cli.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni)})
				return err
			}
		}},
		{"device index taken", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			attach(t, cli, createENI(t, cli, subnetBig), inst.ID, 1)
			eni := createENI(t, cli, subnetBig)
			return func() error {
				_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1)})
				return err
			}
		}},
		{"ENI in another zone", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			eni := createENI(t, cli, subnetB)
			return func() error {
				_, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1)})
				return err
			}
		}},
		{"detach the primary ENI", "OperationNotPermitted", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: aws.String(inst.PrimaryENI.AttachmentID)})
				return err
			}
		}},
		{"unassign an address the ENI does not hold", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			assign(t, cli, inst.PrimaryENI.ID, 1)
			return func() error {
				_, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.9.9"}})
				return err
			}
		}},
		{"unassign the primary address", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), PrivateIpAddresses: []string{inst.PrimaryENI.PrimaryIP.String()}})
				return err
			}
		}},
		{"unknown subnet", "InvalidSubnetID.NotFound", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			return func() error {
				_, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String("subnet-0123456789abcdef0")})
				return err
			}
		}},
		{"unknown security group", "InvalidGroup.NotFound", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			return func() error {
				_, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetBig), Groups: []string{"sg-0123456789abcdef0"}})
				return err
			}
		}},
		{"client token reused with other parameters", "IdempotentParameterMismatch", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			if _, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetBig), ClientToken: aws.String("tok-1")}); err != nil {
				t.Fatal(err)
			}
			return func() error {
				_, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetB), ClientToken: aws.String("tok-1")})
				return err
			}
		}},
		{"dry run", "DryRunOperation", 412, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			return func() error {
				_, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetBig), DryRun: aws.Bool(true)})
				return err
			}
		}},
		{"explicit prefix not aligned", "InvalidParameterValue", 400, func(t *testing.T, l *vpcsimtest.Local, cli *ec2.Client) func() error {
			inst := launchIn(t, l, "m5.large", subnetBig)
			return func() error {
				_, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), Ipv4Prefixes: []string{"100.64.1.8/28"}})
				return err
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := vpcsimtest.Start(t, testConfig())
			cli := ec2Client(l)
			call := tt.setup(t, l, cli)
			before := snap(l.Cloud)
			wantAPIError(t, call(), tt.code, tt.status)
			sameSnapshot(t, before, snap(l.Cloud))
		})
	}
}

func assign(t *testing.T, cli *ec2.Client, eni string, n int32) []string {
	t.Helper()
	out, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), SecondaryPrivateIpAddressCount: aws.Int32(n)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range out.AssignedPrivateIpAddresses {
		got = append(got, aws.ToString(a.PrivateIpAddress))
	}
	return got
}

func assignErr(cli *ec2.Client, eni string, n int32) error {
	_, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), SecondaryPrivateIpAddressCount: aws.Int32(n)})
	return err
}

func assignExplicit(t *testing.T, cli *ec2.Client, eni string, a ...string) {
	t.Helper()
	if err := assignExplicitErr(cli, eni, a...); err != nil {
		t.Fatal(err)
	}
}

func assignExplicitErr(cli *ec2.Client, eni string, a ...string) error {
	_, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: a})
	return err
}

func assignPrefixes(t *testing.T, cli *ec2.Client, eni string, n int32) []string {
	t.Helper()
	out, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), Ipv4PrefixCount: aws.Int32(n)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range out.AssignedIpv4Prefixes {
		got = append(got, aws.ToString(p.Ipv4Prefix))
	}
	return got
}

func attach(t *testing.T, cli *ec2.Client, eni, inst string, device int32) string {
	t.Helper()
	out, err := cli.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni), InstanceId: aws.String(inst), DeviceIndex: aws.Int32(device)})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.AttachmentId)
}
