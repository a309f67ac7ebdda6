package vpcsim_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

func TestCreateNetworkInterfaceOptions(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	free := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses
	var sg string
	for _, g := range mustDescribeGroups(t, cli) {
		sg = aws.ToString(g.GroupId)
	}
	out, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
		SubnetId: aws.String(subnetBig), PrivateIpAddress: aws.String("100.64.5.5"),
		SecondaryPrivateIpAddressCount: aws.Int32(3), Groups: []string{sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := mustENI(t, l.Cloud, aws.ToString(out.NetworkInterface.NetworkInterfaceId))
	if e.PrimaryIP != netip.MustParseAddr("100.64.5.5") || len(e.SecondaryIPs) != 3 || !slices.Equal(e.SecurityGroups, []string{sg}) {
		t.Fatalf("created ENI: %+v", e)
	}
	if e.Gateway != netip.MustParseAddr("100.64.0.1") || e.SubnetCIDR != netip.MustParsePrefix("100.64.0.0/20") {
		t.Fatalf("gateway %s / subnet %s", e.Gateway, e.SubnetCIDR)
	}
	if f := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses; f != free-4 {
		t.Fatalf("free: got %d, want %d", f, free-4)
	}

	pf, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetBig), Ipv4PrefixCount: aws.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	e = mustENI(t, l.Cloud, aws.ToString(pf.NetworkInterface.NetworkInterfaceId))
	if len(e.Prefixes) != 2 || len(pf.NetworkInterface.Ipv4Prefixes) != 2 {
		t.Fatalf("prefix ENI: model %v, SDK %v", e.Prefixes, pf.NetworkInterface.Ipv4Prefixes)
	}
	for _, p := range e.Prefixes {
		if p.Bits() != 28 || p.Masked() != p {
			t.Fatalf("prefix %s not an aligned /28", p)
		}
	}

	// The same ClientToken with the same parameters returns the same ENI.
	in := &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetB), ClientToken: aws.String("idem-1"), Description: aws.String("d")}
	first, err := cli.CreateNetworkInterface(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	n := len(l.Cloud.NetworkInterfaces())
	again, err := cli.CreateNetworkInterface(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(first.NetworkInterface.NetworkInterfaceId) != aws.ToString(again.NetworkInterface.NetworkInterfaceId) || len(l.Cloud.NetworkInterfaces()) != n {
		t.Fatalf("ClientToken retry created a second ENI")
	}
}

func TestAssignExplicitPrefixesAndReassign(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	a := launchIn(t, l, "m5.large", subnetBig)
	b := launchIn(t, l, "m5.large", subnetBig)
	free := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses

	assignExplicit(t, cli, a.PrimaryENI.ID, "100.64.3.3", "100.64.3.4")
	out, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(b.PrimaryENI.ID), Ipv4Prefixes: []string{"100.64.4.16/28"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.AssignedIpv4Prefixes) != 1 || aws.ToString(out.AssignedIpv4Prefixes[0].Ipv4Prefix) != "100.64.4.16/28" {
		t.Fatalf("assigned prefixes: %+v", out.AssignedIpv4Prefixes)
	}
	got := assignPrefixes(t, cli, b.PrimaryENI.ID, 1)
	if f := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses; f != free-2-32 {
		t.Fatalf("free: got %d, want %d", f, free-34)
	}
	// An address inside an assigned prefix is held.
	wantAPIError(t, assignExplicitErr(cli, a.PrimaryENI.ID, "100.64.4.20"), "InvalidParameterValue", 400)

	// AllowReassignment moves a secondary IP from a to b.
	if _, err := cli.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(b.PrimaryENI.ID), PrivateIpAddresses: []string{"100.64.3.3"}, AllowReassignment: aws.Bool(true),
	}); err != nil {
		t.Fatal(err)
	}
	ea, eb := mustENI(t, l.Cloud, a.PrimaryENI.ID), mustENI(t, l.Cloud, b.PrimaryENI.ID)
	if slices.Contains(ea.SecondaryIPs, netip.MustParseAddr("100.64.3.3")) || !slices.Contains(eb.SecondaryIPs, netip.MustParseAddr("100.64.3.3")) {
		t.Fatalf("reassign: a %v, b %v", ea.SecondaryIPs, eb.SecondaryIPs)
	}

	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(b.PrimaryENI.ID), Ipv4Prefixes: got}); err != nil {
		t.Fatal(err)
	}
	if eb = mustENI(t, l.Cloud, b.PrimaryENI.ID); len(eb.Prefixes) != 1 || eb.Prefixes[0] != netip.MustParsePrefix("100.64.4.16/28") {
		t.Fatalf("after prefix unassign: %v", eb.Prefixes)
	}
	if f := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses; f != free-2-16 {
		t.Fatalf("free after unassign: got %d, want %d", f, free-18)
	}
}

func TestModifyAndTerminate(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	free := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses
	keep, gone := createENI(t, cli, subnetBig), createENI(t, cli, subnetBig)
	attach(t, cli, keep, inst.ID, 1)
	goneAtt := attach(t, cli, gone, inst.ID, 2)
	assign(t, cli, keep, 2)
	assign(t, cli, gone, 2)
	if _, err := cli.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: aws.String(gone),
		Attachment:         &types.NetworkInterfaceAttachmentChanges{AttachmentId: aws.String(goneAtt), DeleteOnTermination: aws.Bool(true)},
	}); err != nil {
		t.Fatal(err)
	}
	if !mustENI(t, l.Cloud, gone).DeleteOnTermination {
		t.Fatal("delete-on-termination not set")
	}
	if _, err := cli.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: aws.String(keep), Description: &types.AttributeValue{Value: aws.String("kept")},
	}); err != nil {
		t.Fatal(err)
	}
	if d := mustENI(t, l.Cloud, keep).Description; d != "kept" {
		t.Fatalf("description %q", d)
	}

	out, err := cli.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{inst.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.TerminatingInstances) != 1 || out.TerminatingInstances[0].CurrentState.Name != types.InstanceStateNameTerminated ||
		out.TerminatingInstances[0].PreviousState.Name != types.InstanceStateNameRunning {
		t.Fatalf("state change: %+v", out.TerminatingInstances)
	}
	if i, _ := l.Cloud.Instance(inst.ID); i.State != "terminated" {
		t.Fatalf("instance state %q", i.State)
	}
	for _, id := range []string{inst.PrimaryENI.ID, gone} {
		if _, ok := l.Cloud.NetworkInterface(id); ok {
			t.Fatalf("delete-on-termination ENI %s survived", id)
		}
	}
	if e := mustENI(t, l.Cloud, keep); e.Status != "available" || len(e.SecondaryIPs) != 2 {
		t.Fatalf("kept ENI: %+v", e)
	}
	// Left held: the kept ENI's primary and its two secondaries.
	if f := mustSubnet(t, l.Cloud, subnetBig).FreeAddresses; f != free+1-3 {
		t.Fatalf("free after terminate: got %d, want %d", f, free+1-3)
	}
}

func TestDetachIsAsynchronous(t *testing.T) {
	cfg := testConfig()
	cfg.DetachDelay = 500 * time.Millisecond
	l := vpcsimtest.Start(t, cfg)
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := createENI(t, cli, subnetBig)
	att := attach(t, cli, eni, inst.ID, 1)
	if _, err := cli.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: aws.String(att)}); err != nil {
		t.Fatal(err)
	}
	if e := mustENI(t, l.Cloud, eni); e.AttachmentStatus != "detaching" || e.Status != "in-use" {
		t.Fatalf("right after detach: status %s, attachment %s", e.Status, e.AttachmentStatus)
	}
	det, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{
		{Name: aws.String("attachment.status"), Values: []string{"detaching"}}}})
	if err != nil || len(det.NetworkInterfaces) != 1 || aws.ToString(det.NetworkInterfaces[0].NetworkInterfaceId) != eni {
		t.Fatalf("attachment.status=detaching: %v %v", det, err)
	}
	wantAPIError(t, func() error {
		_, err := cli.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(eni)})
		return err
	}(), "InvalidNetworkInterface.InUse", 400)
	w := ec2.NewNetworkInterfaceAvailableWaiter(cli, func(o *ec2.NetworkInterfaceAvailableWaiterOptions) {
		o.MinDelay, o.MaxDelay = 10*time.Millisecond, 20*time.Millisecond
	})
	if err := w.Wait(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}}, 5*time.Second); err != nil {
		t.Fatalf("ENI never became available: %v", err)
	}
	if e := mustENI(t, l.Cloud, eni); e.Status != "available" || e.InstanceID != "" {
		t.Fatalf("after the delay: %+v", e)
	}
}

func TestTags(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := inst.PrimaryENI.ID
	if _, err := cli.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{eni, inst.ID, subnetBig}, Tags: []types.Tag{
		{Key: aws.String("a"), Value: aws.String("1")}, {Key: aws.String("b"), Value: aws.String("2")}, {Key: aws.String("c"), Value: aws.String("3")}}}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"a": "1", "b": "2", "c": "3"}, mustENI(t, l.Cloud, eni).Tags); diff != "" {
		t.Fatalf("ENI tags (-want +got):\n%s", diff)
	}
	if s := mustSubnet(t, l.Cloud, subnetBig); s.Tags["b"] != "2" {
		t.Fatalf("subnet tags %v", s.Tags)
	}
	// Key a goes; key b stays because its value does not match.
	if _, err := cli.DeleteTags(ctx, &ec2.DeleteTagsInput{Resources: []string{eni}, Tags: []types.Tag{{Key: aws.String("a")}, {Key: aws.String("b"), Value: aws.String("other")}}}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"b": "2", "c": "3"}, mustENI(t, l.Cloud, eni).Tags); diff != "" {
		t.Fatalf("ENI tags after delete (-want +got):\n%s", diff)
	}
	if _, err := cli.DeleteTags(ctx, &ec2.DeleteTagsInput{Resources: []string{eni}}); err != nil {
		t.Fatal(err)
	}
	if tags := mustENI(t, l.Cloud, eni).Tags; len(tags) != 0 {
		t.Fatalf("DeleteTags without tags left %v", tags)
	}
	_, err := cli.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{eni}, Tags: []types.Tag{{Key: aws.String("aws:x"), Value: aws.String("1")}}})
	wantAPIError(t, err, "InvalidParameterValue", 400)
	_, err = cli.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{eni, "eni-0123456789abcdef0"}, Tags: []types.Tag{{Key: aws.String("x"), Value: aws.String("1")}}})
	wantAPIError(t, err, "InvalidNetworkInterfaceID.NotFound", 400)
	if tags := mustENI(t, l.Cloud, eni).Tags; len(tags) != 0 {
		t.Fatalf("a refused CreateTags tagged %v", tags)
	}
	var many []types.Tag
	for i := range 51 {
		many = append(many, types.Tag{Key: aws.String(fmt.Sprint("k", i)), Value: aws.String("v")})
	}
	_, err = cli.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{eni}, Tags: many})
	wantAPIError(t, err, "TagLimitExceeded", 400)
}

func mustDescribeGroups(t *testing.T, cli *ec2.Client) []types.SecurityGroup {
	t.Helper()
	out, err := cli.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupNames: []string{"default"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.SecurityGroups) != 1 || aws.ToString(out.SecurityGroups[0].GroupName) != "default" {
		t.Fatalf("security groups: %+v", out.SecurityGroups)
	}
	return out.SecurityGroups
}

// recorder is an Observer that records events as text.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}
func (r *recorder) ENIAttached(inst string, e vpcsim.ENIInfo) {
	r.add("attach %s %s dev%d %s", inst, e.ID, e.DeviceIndex, e.PrimaryIP)
}
func (r *recorder) ENIDetached(inst, eni string) { r.add("detach %s %s", inst, eni) }
func (r *recorder) AddressesAssigned(eni string, p []netip.Prefix) {
	r.add("assign %s %v", eni, p)
}
func (r *recorder) AddressesUnassigned(eni string, p []netip.Prefix) {
	r.add("unassign %s %v", eni, p)
}
func (r *recorder) InstanceTerminated(inst string) { r.add("terminated %s", inst) }

func TestObserverSeesEveryChange(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	rec := &recorder{}
	l.Cloud.SetObserver(rec)
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := createENI(t, cli, subnetBig)
	att := attach(t, cli, eni, inst.ID, 1)
	e := mustENI(t, l.Cloud, eni)
	assignExplicit(t, cli, eni, "100.64.7.7")
	pf := assignPrefixes(t, cli, eni, 1)
	if _, err := cli.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: []string{"100.64.7.7"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: aws.String(att)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Cloud.TerminateInstance(inst.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("attach %s %s dev0 %s", inst.ID, inst.PrimaryENI.ID, inst.PrimaryENI.PrimaryIP),
		fmt.Sprintf("attach %s %s dev1 %s", inst.ID, eni, e.PrimaryIP),
		fmt.Sprintf("assign %s [100.64.7.7/32]", eni),
		fmt.Sprintf("assign %s [%s]", eni, pf[0]),
		fmt.Sprintf("unassign %s [100.64.7.7/32]", eni),
		fmt.Sprintf("detach %s %s", inst.ID, eni),
		fmt.Sprintf("detach %s %s", inst.ID, inst.PrimaryENI.ID),
		fmt.Sprintf("terminated %s", inst.ID),
	}
	if diff := cmp.Diff(want, rec.events); diff != "" {
		t.Fatalf("observer events (-want +got):\n%s", diff)
	}
}

func TestAttachIsAsynchronous(t *testing.T) {
	cfg := testConfig()
	cfg.AttachDelay = 500 * time.Millisecond
	l := vpcsimtest.Start(t, cfg)
	rec := &recorder{}
	l.Cloud.SetObserver(rec)
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := createENI(t, cli, subnetBig)
	attach(t, cli, eni, inst.ID, 1)
	if e := mustENI(t, l.Cloud, eni); e.AttachmentStatus != "attaching" || e.Status != "in-use" {
		t.Fatalf("right after attach: status %s, attachment %s", e.Status, e.AttachmentStatus)
	}
	md := imdsClient(l, inst.ID)
	if macs := imdsGet(t, md, "network/interfaces/macs/"); strings.Count(macs, "/") != 1 {
		t.Fatalf("IMDS lists an ENI still attaching: %q", macs)
	}
	deadline := time.Now().Add(5 * time.Second)
	for mustENI(t, l.Cloud, eni).AttachmentStatus != "attached" {
		if time.Now().After(deadline) {
			t.Fatal("attachment never completed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	out, err := cli.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}})
	if err != nil || out.NetworkInterfaces[0].Attachment.Status != types.AttachmentStatusAttached {
		t.Fatalf("described attachment: %v %v", out, err)
	}
	if macs := imdsGet(t, md, "network/interfaces/macs/"); strings.Count(macs, "/") != 2 {
		t.Fatalf("IMDS misses the attached ENI: %q", macs)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if n := len(rec.events); n != 2 || !strings.Contains(rec.events[1], eni) {
		t.Fatalf("observer events: %v", rec.events)
	}
}

func TestCreateWithExplicitAddressesAndModifyGroups(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	out, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
		SubnetId: aws.String(subnetBig),
		PrivateIpAddresses: []types.PrivateIpAddressSpecification{
			{PrivateIpAddress: aws.String("100.64.2.10"), Primary: aws.Bool(true)},
			{PrivateIpAddress: aws.String("100.64.2.11")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := mustENI(t, l.Cloud, aws.ToString(out.NetworkInterface.NetworkInterfaceId))
	if e.PrimaryIP.String() != "100.64.2.10" || len(e.SecondaryIPs) != 1 || e.SecondaryIPs[0].String() != "100.64.2.11" {
		t.Fatalf("explicit addresses: %+v", e)
	}
	pf, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{
		SubnetId:     aws.String(subnetBig),
		Ipv4Prefixes: []types.Ipv4PrefixSpecificationRequest{{Ipv4Prefix: aws.String("100.64.3.32/28")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := mustENI(t, l.Cloud, aws.ToString(pf.NetworkInterface.NetworkInterfaceId))
	if len(p.Prefixes) != 1 || p.Prefixes[0].String() != "100.64.3.32/28" {
		t.Fatalf("explicit prefix: %v", p.Prefixes)
	}
	_, err = cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetBig), PrivateIpAddress: aws.String("100.64.2.11")})
	wantAPIError(t, err, "InvalidParameterValue", 400)
	_, err = cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(subnetBig), SecondaryPrivateIpAddressCount: aws.Int32(1), Ipv4PrefixCount: aws.Int32(1)})
	wantAPIError(t, err, "InvalidParameterCombination", 400)

	sg := aws.ToString(mustDescribeGroups(t, cli)[0].GroupId)
	if _, err := cli.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(e.ID), Groups: []string{sg, sg}}); err != nil {
		t.Fatal(err)
	}
	if got := mustENI(t, l.Cloud, e.ID).SecurityGroups; !slices.Equal(got, []string{sg}) {
		t.Fatalf("groups %v", got)
	}
	_, err = cli.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(e.ID), Groups: []string{"sg-0123456789abcdef0"}})
	wantAPIError(t, err, "InvalidGroup.NotFound", 400)
	_, err = cli.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(e.ID),
		Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: aws.String("eni-attach-0123456789abcdef0"), DeleteOnTermination: aws.Bool(true)}})
	wantAPIError(t, err, "InvalidAttachmentID.NotFound", 400)
	_, err = cli.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(e.ID)})
	wantAPIError(t, err, "InvalidParameterCombination", 400)
}
