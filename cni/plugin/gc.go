package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/api"
)

// GC is CNI GC (spec 1.1 §GC): it hands the runtime's valid attachments
// (cni.dev/valid-attachments, or cni.dev/attachments) for this network to vpcipd, which releases
// every other assignment of the network, and removes the host routes, rules
// and veths of what was released. A config without the list is an error
// (code 7) rather than "nothing is valid".
func (p *Plugin) GC(args *skel.CmdArgs) error {
	in, err := start("GC", args, true)
	if err != nil {
		return err
	}
	defer in.close()
	if !in.conf.HasValidAttachments {
		return invalidConfig("cni.dev/valid-attachments", "missing; GC needs the runtime's list of valid attachments")
	}
	valid := make([]api.Key, 0, len(in.conf.ValidAttachments))
	for _, a := range in.conf.ValidAttachments {
		valid = append(valid, api.Key{Network: in.conf.Name, ContainerID: a.ContainerID, IfName: a.IfName})
	}
	ctx, cancel := in.ctx(in.conf.Timeouts.GC)
	defer cancel()
	resp, err := in.client.GC(ctx, api.GCRequest{Network: in.conf.Name, Valid: valid})
	if err != nil {
		return daemonError("gc", api.Key{Network: in.conf.Name}, err)
	}
	var errs []error
	for _, asg := range resp.Released {
		veth := datapath.HostVethName(in.conf.VethPrefix, asg.Pod.Namespace, asg.Pod.Name, asg.Key.ContainerID)
		if err := removeHostSide(in, asg.Address, asg.Key, veth); err != nil {
			errs = append(errs, fmt.Errorf("%s (%v): %w", asg.Key, asg.Address, err))
		}
	}
	in.log.Info("gc", "valid", len(valid), "released", len(resp.Released))
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("GC released %d attachments but could not remove all host state: %v", len(resp.Released), err), "")
	}
	return nil
}
