package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/api"
)

// Check is CNI CHECK: the daemon must still hold the key's assignment, and
// every piece of docs/design.md §4 wiring must be present; a prevResult, when
// given, must agree with both. It changes nothing. Failures name each
// missing item; a daemon that cannot answer gives code 11, not a failure.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	in, err := start("CHECK", args, false)
	if err != nil {
		return err
	}
	defer in.close()

	ctx, cancel := in.ctx(in.conf.Timeouts.Check)
	defer cancel()
	asg, err := in.client.Check(ctx, api.CheckRequest{Key: in.key, HostVeth: in.ownVeth(),
		Pod: api.Pod{Namespace: in.pod.Namespace, Name: in.pod.Name, UID: in.pod.UID}})
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
			// The daemon's own words go in details: they name the key too.
			return types.NewError(types.ErrInternal, fmt.Sprintf("vpcipd holds no address for %s", in.key), ae.Error())
		}
		return daemonError("check", in.key, err)
	}
	att := in.attachment(asg)
	var problems []error
	prev, perr := in.conf.PrevResult()
	if perr != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: %v", perr), "")
	}

	if att.PodIP.Is6() && in.conf.V4Egress {
		problems = append(problems, in.checkEgress4(&att)...)
	}

	podNS, err := datapath.OpenNetns(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("open pod netns %s: %v", args.Netns, err), "")
	}
	defer podNS.Close()
	wired, err := datapath.Check(podNS, att)
	if err != nil {
		problems = append(problems, err)
	}
	switch own, alias, err := vethOwner(att.HostVeth, in.key); {
	case err != nil:
		problems = append(problems, err)
	case own == vethOther:
		problems = append(problems, fmt.Errorf("host veth %s wires another sandbox (%q)", att.HostVeth, alias))
	}
	if prev != nil {
		problems = append(problems, comparePrev(prev, att, wired)...)
	}
	if err := errors.Join(problems...); err != nil {
		in.log.Error("check failed", "error", err)
		return types.NewError(types.ErrInternal, fmt.Sprintf("CHECK %s (%v): %v", in.key, asg.Address, err), "")
	}
	in.log.Debug("check passed", "address", asg.Address.String())
	return nil
}

// comparePrev checks that the runtime's recorded result still describes the
// pod: the address the daemon holds, and the interfaces' names and MACs as
// the kernel reports them now (B33: both were read back after the last
// change, so a healthy pod always matches).
func comparePrev(prev types.Result, att datapath.Attachment, w datapath.Wired) []error {
	res, err := current.NewResultFromResult(prev)
	if err != nil {
		return []error{fmt.Errorf("prevResult: %v", err)}
	}
	var p []error
	found := false
	for _, ipc := range res.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && a.Unmap() == att.PodIP {
			found = true
		}
	}
	if !found {
		p = append(p, fmt.Errorf("prevResult does not list %v, the address vpcipd holds for this attachment", att.PodIP))
	}
	for _, itf := range res.Interfaces {
		var want string
		switch {
		case itf.Sandbox == "" && itf.Name == att.HostVeth && w.Host.Name != "":
			want = w.Host.HardwareAddr.String()
		case itf.Sandbox != "" && itf.Name == att.IfName && w.Pod.Name != "":
			want = w.Pod.HardwareAddr.String()
		default:
			continue
		}
		if itf.Mac != "" && itf.Mac != want {
			p = append(p, fmt.Errorf("interface %s MAC is %s, prevResult says %s", itf.Name, want, itf.Mac))
		}
	}
	return p
}

// checkEgress4 is CHECK's part for an IPv6 attachment's IPv4 egress
// address: host-local must still hold an allocation for the attachment,
// and the address its store records for it (the result leaves it out, see
// result) is set on att, whose wiring datapath.Check then verifies.
func (in *invocation) checkEgress4(att *datapath.Attachment) []error {
	var p []error
	ctx, cancel := in.ctx(in.conf.Timeouts.Check)
	defer cancel()
	if err := invoke.DelegateCheck(ctx, egress4IPAM, in.egress4Conf(nil), nil); err != nil {
		p = append(p, fmt.Errorf("IPv4 egress address: %s CHECK: %w", egress4IPAM, err))
	}
	a, ok, err := in.egress4Record()
	switch {
	case err != nil:
		return append(p, fmt.Errorf("IPv4 egress address: %s's store: %w", egress4IPAM, err))
	case !ok:
		return append(p, fmt.Errorf("%s's store %s holds no IPv4 egress address for this attachment", egress4IPAM, filepath.Join(in.conf.V4EgressDataDir, in.conf.Name)))
	}
	att.Egress4 = a
	return p
}
