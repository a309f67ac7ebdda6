package plugin

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// Status is CNI STATUS (spec 1.1): success once vpcipd reports it is ready to
// assign; error 50 (plugin not available) with the daemon's reason before
// that, or when the daemon cannot be reached.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	in, err := start("STATUS", args, true)
	if err != nil {
		return err
	}
	defer in.close()
	ctx, cancel := in.ctx(in.conf.Timeouts.Status)
	defer cancel()
	st, err := in.client.Status(ctx)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("vpcipd not available: %v", err), "")
	}
	if !st.Ready {
		reason := st.Reason
		if reason == "" {
			reason = "not ready"
		}
		return types.NewError(types.ErrPluginNotAvailable, "vpcipd not ready: "+reason, "")
	}
	return nil
}
