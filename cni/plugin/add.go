package plugin

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/api"
)

// Add is CNI ADD: assign an address through vpcipd, wire the datapath and
// print the Result. The veth pair is created while the daemon answers (it
// needs no address). Anything that fails after the daemon assigned the
// address is undone here, and the address released, before the error
// returns (B37: the plugin cannot rely on a DEL arriving).
func (p *Plugin) Add(args *skel.CmdArgs) error {
	in, err := start("ADD", args, false)
	if err != nil {
		return err
	}
	defer in.close()
	began := time.Now()
	hostNS, podNS, err := openNetns(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, err.Error(), "")
	}
	defer hostNS.Close()
	defer podNS.Close()
	nl, err := datapath.Open(podNS)
	if err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	defer nl.Close()

	asg, pair, err := in.assignWhilePairing(args, nl, hostNS)
	if err != nil {
		return err
	}
	assigned := time.Now()
	att := in.attachment(asg)
	in.log = in.log.With("address", asg.Address.String(), "routeTable", asg.RouteTable, "hostVeth", att.HostVeth)
	var wired datapath.Wired
	err = pair.err
	if err == nil && att.PodIP.Is6() && in.conf.V4Egress {
		err = in.egress4(&att, args.Path)
	}
	if err == nil {
		wired, err = nl.Configure(att)
	}
	if err == nil && att.Egress4.IsValid() {
		err = datapath.EnsureEgress4SNAT(filepath.Join(in.conf.V4EgressDataDir, "iptables.lock"))
	}
	if err != nil {
		in.undo(args.Netns, att)
		in.log.Error("wiring failed; undone and address released", "error", err)
		code := uint(types.ErrInternal)
		if errors.Is(err, datapath.ErrNotOwned) {
			// CNI spec 1.1 §ADD: an interface of the requested name that
			// already exists is an error; the variable naming it is at fault.
			code = types.ErrInvalidEnvironmentVariables
			err = fmt.Errorf("CNI_IFNAME %s: %w", args.IfName, err)
		}
		return types.NewError(code, fmt.Sprintf("wire %v for %s: %v", asg.Address, in.key, err), "")
	}
	if pair.replaced.Veth {
		in.log.Warn("replaced an existing host veth of the same pod", "sandbox", pair.previous.String(),
			"routed", fmt.Sprint(pair.replaced.Routed), "rulesRemoved", pair.replaced.Rules)
	}
	if err := p.print(result(args, att, wired), in.conf.CNIVersion); err != nil {
		in.undo(args.Netns, att)
		return err
	}
	in.log.Info("added", "mtu", att.MTU, "assignMs", ms(assigned.Sub(began)), "wireMs", ms(time.Since(assigned)))
	in.releaseReplaced(pair)
	in.releaseReplacedEgress4(pair, args.Path)
	return nil
}

// releaseReplaced gives back the address of the older sandbox of this pod
// whose veth ADD replaced (its pod interface went with it, so nothing can
// use the address any more): a crash-looping pod whose sandboxes are
// recreated without a DEL (a runtime restart) would otherwise hold one
// address per sandbox until GC. The release is by that sandbox's own key,
// read from the veth it wired; a failure is logged, GC reclaims it.
//
// It runs only after CreatePair deleted that veth's route and rules
// (datapath.Replaced): deleting them after the release could delete the
// rules of the next pod the daemon gives the address to, and leaving them
// sends that pod's traffic by the old sandbox's ENI table (B13).
func (in *invocation) releaseReplaced(pair pairing) {
	if !pair.replaced.Veth || pair.previous.ContainerID == "" || pair.previous == in.key {
		return
	}
	ctx, cancel := in.ctx(in.conf.Timeouts.Release)
	defer cancel()
	resp, err := in.client.Release(ctx, api.ReleaseRequest{Key: pair.previous})
	switch {
	case err != nil:
		in.log.Warn("release of the replaced sandbox failed; GC reclaims it", "sandbox", pair.previous.String(), "error", err)
	case resp.Assignment != nil && !slices.Contains(pair.replaced.Routed, resp.Assignment.Address):
		// The daemon's record names an address the veth did not route (its
		// route was gone already, or the record is damaged): rules of that
		// address, if any, are left to vpcipd's host check.
		in.log.Warn("released the replaced sandbox's address, which its veth did not route", "sandbox", pair.previous.String(),
			"address", resp.Assignment.Address.String(), "routed", fmt.Sprint(pair.replaced.Routed))
	case resp.Assignment != nil:
		in.log.Info("released the replaced sandbox's address", "sandbox", pair.previous.String(), "address", resp.Assignment.Address.String())
	}
}

// pairing is the outcome of datapath.CreatePair.
type pairing struct {
	replaced datapath.Replaced
	previous api.Key // the sandbox the replaced veth recorded (zero: none)
	err      error
}

// assignWhilePairing asks the daemon for the address while the veth pair is
// created through nl (used by nothing else until the pairing is done). When
// the daemon refuses, the pair is removed and the daemon's error returned as
// a CNI error; a pairing failure is returned for the caller to undo with the
// address known.
func (in *invocation) assignWhilePairing(args *skel.CmdArgs, nl *datapath.Session, hostNS ns.NetNS) (api.Assignment, pairing, error) {
	hostVeth := in.hostVeth()
	done := make(chan pairing, 1)
	go func() {
		GrowStack()
		// The alias is set before any route leads to the veth: every wired
		// veth names its sandbox.
		replaced, err := nl.CreatePair(hostNS, hostVeth, args.IfName, in.conf.MTU, Identity(in.key))
		done <- pairing{replaced, in.sandboxOf(replaced.Alias), err}
	}()
	ctx, cancel := in.ctx(in.conf.Timeouts.Assign)
	defer cancel()
	asg, err := in.client.Assign(ctx, api.AssignRequest{
		Key:   in.key,
		Pod:   api.Pod{Namespace: in.pod.Namespace, Name: in.pod.Name, UID: in.pod.UID},
		Netns: args.Netns,
	})
	pair := <-done
	if err != nil {
		cerr := daemonError("assign", in.key, err)
		in.log.Error("assign failed", "error", cerr.Msg, "code", cerr.Code)
		unpair := datapath.Attachment{HostVeth: hostVeth, IfName: args.IfName}
		if err := datapath.Teardown(args.Netns, Identity(in.key), unpair); err != nil {
			in.log.Error("remove the veth pair made while waiting", "error", err)
		}
		return asg, pair, cerr
	}
	return asg, pair, nil
}

// attachment derives the wiring from the daemon's answer. The config's mtu
// wins when set; otherwise the daemon's (the ENI MTU), else DefaultMTU.
func (in *invocation) attachment(asg api.Assignment) datapath.Attachment {
	mtu := in.conf.MTU
	if !in.conf.MTUSet && asg.MTU >= minMTU && asg.MTU <= maxMTU {
		mtu = asg.MTU
	}
	return datapath.Attachment{
		PodIP:      asg.Address,
		RouteTable: asg.RouteTable,
		MTU:        mtu,
		HostVeth:   in.hostVeth(),
		IfName:     in.key.IfName,
	}
}

// openNetns opens the node netns (the current one) and the pod's.
func openNetns(path string) (hostNS, podNS ns.NetNS, err error) {
	hostNS, err = ns.GetCurrentNS()
	if err != nil {
		return nil, nil, fmt.Errorf("open node netns: %w", err)
	}
	podNS, err = datapath.OpenNetns(path)
	if err != nil {
		hostNS.Close()
		return nil, nil, fmt.Errorf("open pod netns %s: %w", path, err)
	}
	return hostNS, podNS, nil
}

// undo removes everything a failed ADD made and gives the address back, with
// fresh deadlines (the ADD's may be spent).
func (in *invocation) undo(netnsPath string, att datapath.Attachment) {
	if err := datapath.Teardown(netnsPath, Identity(in.key), att); err != nil {
		in.log.Error("undo wiring", "error", err)
	}
	ctx, cancel := in.ctx(in.conf.Timeouts.Release)
	defer cancel()
	if att.Egress4.IsValid() {
		if err := in.releaseEgress4(ctx); err != nil {
			in.log.Error("release of the IPv4 egress address after failed ADD; GC reclaims it", "error", err)
		}
	}
	if _, err := in.client.Release(ctx, api.ReleaseRequest{Key: in.key}); err != nil {
		in.log.Error("release after failed ADD; the daemon's GC reclaims it", "error", err)
	}
}

// result is the CNI Result: host veth (index 0), pod interface (index 1,
// with its sandbox), the /32 with the link-local gateway, the default route;
// for an IPv6 pod the /128 with gateway fe80::1 and the route ::/0 (CNI spec
// 1.1: an ips entry's family is its address's; there is no version field).
// An IPv6 pod's IPv4 egress address is wired in the pod but left out of the
// result: a runtime reports every address of the result as a pod IP
// (kubelet's status.podIPs), and a node-local 169.254.172.0/22 address is
// nobody's to reach the pod by; CHECK finds it in host-local's store.
func result(args *skel.CmdArgs, att datapath.Attachment, w datapath.Wired) *current.Result {
	gw := net.IP(datapath.Gateway.AsSlice())
	def := net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	if att.PodIP.Is6() {
		gw = net.IP(datapath.GatewayIPv6.AsSlice())
		def = net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	ips := []*current.IPConfig{{Interface: current.Int(1), Address: podIPNet(att.PodIP), Gateway: gw}}
	routes := []*types.Route{{Dst: def, GW: gw}}
	return &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: w.Host.Name, Mac: w.Host.HardwareAddr.String(), Mtu: w.Host.MTU},
			{Name: w.Pod.Name, Mac: w.Pod.HardwareAddr.String(), Mtu: w.Pod.MTU, Sandbox: args.Netns},
		},
		IPs:    ips,
		Routes: routes,
	}
}

// egress4 gives an IPv6 attachment its IPv4 egress address (egress4.go),
// from the host-local found in cniPath (CNI_PATH).
func (in *invocation) egress4(att *datapath.Attachment, cniPath string) error {
	ctx, cancel := in.ctx(in.conf.Timeouts.Assign)
	defer cancel()
	a, err := in.allocEgress4(ctx, cniPath)
	if err != nil {
		return err
	}
	att.Egress4 = a
	in.log = in.log.With("egress4", a.String())
	return nil
}

// ms renders d in milliseconds with microsecond precision, for logs.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
