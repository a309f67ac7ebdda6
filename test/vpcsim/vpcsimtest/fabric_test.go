package vpcsimtest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// uniquePrefix is "vt" and 4 hex digits, so parallel test runs do not meet.
func uniquePrefix() string {
	b := make([]byte, 2)
	rand.Read(b)
	return "vt" + hex.EncodeToString(b)
}

// imdsGet reads one metadata path through the SDK's IMDS client, speaking
// from inside the instance's netns.
func imdsGet(t *testing.T, f *vpcsimtest.Fabricated, instanceID, path string) string {
	t.Helper()
	c := imds.New(imds.Options{Endpoint: f.IMDSURL, HTTPClient: f.HTTPClient(instanceID)})
	out, err := c.GetMetadata(context.Background(), &imds.GetMetadataInput{Path: path})
	if err != nil {
		t.Fatalf("IMDS %s from %s: %v", path, instanceID, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(out.Content)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestIMDSAnswersTheCallingInstance(t *testing.T) {
	f := vpcsimtest.StartFabric(t, vpcsim.Config{}, uniquePrefix())
	a := f.Launch(t, "m5.large")
	b := f.Launch(t, "m5.large")
	for _, inst := range []vpcsim.InstanceInfo{a, b} {
		if got := imdsGet(t, f, inst.ID, "instance-id"); got != inst.ID {
			t.Errorf("instance-id from %s's netns = %q", inst.ID, got)
		}
		if got := imdsGet(t, f, inst.ID, "mac"); got != inst.PrimaryENI.MAC {
			t.Errorf("mac from %s's netns = %q, want %q", inst.ID, got, inst.PrimaryENI.MAC)
		}
		if got := imdsGet(t, f, inst.ID, "local-ipv4"); got != inst.PrimaryENI.PrimaryIP.String() {
			t.Errorf("local-ipv4 from %s's netns = %q, want %s", inst.ID, got, inst.PrimaryENI.PrimaryIP)
		}
	}
}

// TestEC2FromInsideTheFabric assigns a secondary IP through the EC2 API
// reached from inside an instance netns, and finds the router's route to the
// instance's ENI for it; unassigning removes it.
func TestEC2FromInsideTheFabric(t *testing.T) {
	f := vpcsimtest.StartFabric(t, vpcsim.Config{}, uniquePrefix())
	inst := f.Launch(t, "m5.large")
	client := ec2.New(ec2.Options{
		Region:           f.Cloud.Region(),
		BaseEndpoint:     aws.String(f.EC2URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		HTTPClient:       f.HTTPClient(inst.ID),
		RetryMaxAttempts: 1,
	})
	ctx := context.Background()
	eni := inst.PrimaryENI.ID
	out, err := client.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(eni), SecondaryPrivateIpAddressCount: aws.Int32(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.AssignedPrivateIpAddresses) != 1 {
		t.Fatalf("assigned %v, want one address", out.AssignedPrivateIpAddresses)
	}
	addr := netip.MustParseAddr(aws.ToString(out.AssignedPrivateIpAddresses[0].PrivateIpAddress))
	if got := routerRouteDev(t, f, addr); !strings.HasPrefix(got, f.Fabric.Prefix()+"e") {
		t.Fatalf("router route to %s via %q, want the ENI's router end", addr, got)
	}
	_, err = client.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(eni), PrivateIpAddresses: []string{addr.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := routerRouteDev(t, f, addr); got != "" {
		t.Errorf("router still routes %s via %s after unassign", addr, got)
	}
}

// routerRouteDev returns the device of the router's main-table route to
// addr/32, or "".
func routerRouteDev(t *testing.T, f *vpcsimtest.Fabricated, addr netip.Addr) string {
	t.Helper()
	return routerRoute(t, f, netip.PrefixFrom(addr, addr.BitLen()))
}

// TestAttachThroughTheAPI creates and attaches an ENI through the EC2 API
// and finds it in the instance's netns as eth1 with the ENI's MAC, left
// down as EC2 leaves it; detaching removes it.
func TestAttachThroughTheAPI(t *testing.T) {
	f := vpcsimtest.StartFabric(t, vpcsim.Config{}, uniquePrefix())
	inst := f.Launch(t, "m5.large")
	client := ec2.New(ec2.Options{
		Region:           f.Cloud.Region(),
		BaseEndpoint:     aws.String(f.EC2URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		HTTPClient:       f.HTTPClient(inst.ID),
		RetryMaxAttempts: 1,
	})
	ctx := context.Background()
	created, err := client.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(inst.SubnetID)})
	if err != nil {
		t.Fatal(err)
	}
	eni := created.NetworkInterface
	att, err := client.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
		NetworkInterfaceId: eni.NetworkInterfaceId, InstanceId: aws.String(inst.ID), DeviceIndex: aws.Int32(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := nodeHandle(t, f, inst.ID)
	eth1, err := h.LinkByName("eth1")
	if err != nil {
		t.Fatalf("eth1 after attach: %v", err)
	}
	if got := eth1.Attrs().HardwareAddr.String(); got != aws.ToString(eni.MacAddress) {
		t.Errorf("eth1 MAC %s, want the ENI's %s", got, aws.ToString(eni.MacAddress))
	}
	if eth1.Attrs().Flags&net.FlagUp != 0 {
		t.Error("eth1 is up before the instance configured it")
	}
	primary := netip.MustParseAddr(aws.ToString(eni.PrivateIpAddress))
	if got := routerRouteDev(t, f, primary); !strings.HasPrefix(got, f.Fabric.Prefix()+"e") {
		t.Errorf("router route to the new ENI's primary %s via %q", primary, got)
	}
	if _, err := client.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: att.AttachmentId}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.LinkByName("eth1"); err == nil {
		t.Error("eth1 still there after detach")
	}
	if got := routerRouteDev(t, f, primary); got != "" {
		t.Errorf("router still routes %s via %s after detach", primary, got)
	}
}

// nodeHandle opens a netlink socket inside an instance's netns.
func nodeHandle(t *testing.T, f *vpcsimtest.Fabricated, instanceID string) netlinksafe.Handle {
	t.Helper()
	nsh, err := netns.GetFromPath(f.NetnsPath(instanceID))
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlinksafe.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// TestIMDSIgnoresOtherSources: a request from an address that is not an
// instance's primary address (here a secondary IP on eth0) gets no answer.
func TestIMDSIgnoresOtherSources(t *testing.T) {
	f := vpcsimtest.StartFabric(t, vpcsim.Config{}, uniquePrefix())
	inst := f.Launch(t, "m5.large")
	client := ec2.New(ec2.Options{
		Region:           f.Cloud.Region(),
		BaseEndpoint:     aws.String(f.LocalEC2URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		RetryMaxAttempts: 1,
	})
	out, err := client.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{
		NetworkInterfaceId: aws.String(inst.PrimaryENI.ID), SecondaryPrivateIpAddressCount: aws.Int32(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	secondary := netip.MustParseAddr(aws.ToString(out.AssignedPrivateIpAddresses[0].PrivateIpAddress))
	h := nodeHandle(t, f, inst.ID)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: netlink.NewIPNet(secondary.AsSlice())}); err != nil {
		t.Fatal(err)
	}
	for src, want := range map[netip.Addr]int{inst.PrimaryENI.PrimaryIP: http.StatusOK, secondary: http.StatusNotFound} {
		c := f.HTTPClient(inst.ID)
		dialer := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		c.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := ns.WithNetNSPath(f.NetnsPath(inst.ID), func(ns.NetNS) error {
				var err error
				conn, err = dialer.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}
		req, _ := http.NewRequest(http.MethodPut, f.IMDSURL+"/latest/api/token", nil)
		req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("token from %s: %v", src, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("token from %s: HTTP %d, want %d", src, resp.StatusCode, want)
		}
	}
}
