package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/ipamd/api"
)

// GC is CNI GC (spec 1.1 §GC): it hands the runtime's valid attachments
// (cni.dev/valid-attachments, or cni.dev/attachments) for this network to
// vpcipd, which lists every other assignment of the network past its grace
// period (/v1/gc/plan); it removes the host veth, route and rules of each
// while its key still holds the address, then has vpcipd release those
// (/v1/gc/release). Released first, an address could go to the next pod
// before its old rules went, and their removal by address would take the
// new pod's (B13). An attachment whose host state could not be removed
// stays held for the next GC, and the GC fails (code 999) naming it; so does
// one whose address the host routes to another sandbox's veth (that
// sandbox sends from it: released, it would go to a third pod), unless the
// key no longer holds the address at vpcipd (released since the plan, and
// handed to that sandbox): then there is nothing left to collect.
//
// A vpcipd that predates the plan gets the one-step GC (/v1/gc: release,
// then removal), as before. A config without the list is an error
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
	req := api.GCRequest{Network: in.conf.Name, Valid: make([]api.Key, 0, len(in.conf.ValidAttachments))}
	for _, a := range in.conf.ValidAttachments {
		req.Valid = append(req.Valid, api.Key{Network: in.conf.Name, ContainerID: a.ContainerID, IfName: a.IfName})
	}
	ctx, cancel := in.ctx(in.conf.Timeouts.GC)
	defer cancel()
	plan, err := in.client.GCPlan(ctx, req)
	if errors.Is(err, api.ErrNoEndpoint) {
		in.log.Warn("vpcipd predates the GC plan; releasing before removing host state", "error", err)
		return in.gcOneStep(ctx, req)
	}
	if err != nil {
		return daemonError("gc plan", api.Key{Network: in.conf.Name}, err)
	}
	var errs []error
	// Attachments whose host state stays keep their IPv4 egress address.
	kept := slices.Clone(in.conf.ValidAttachments)
	for _, asg := range plan.Released {
		veths := in.recordedVeths(asg)
		unlock, ok := in.lockStale(ctx, asg, veths)
		if !ok {
			kept = append(kept, types.GCAttachment{ContainerID: asg.Key.ContainerID, IfName: asg.Key.IfName})
			continue
		}
		err := removeHostSide(in, asg.Address, asg.Key, veths...)
		unlock()
		if err != nil {
			if errors.Is(err, errRoutedElsewhere) && !in.stillHolds(ctx, asg) {
				// Released since the plan (its DEL, or the daemon's own
				// check that its pod is gone), and the address taken by
				// a new sandbox: nothing of it is left to collect.
				in.log.Info("stale attachment released since the GC plan; its address is another sandbox's now", "key", asg.Key.String(), "address", asg.Address.String())
				continue
			}
			errs = append(errs, fmt.Errorf("%s (%v) kept for the next GC: %w", asg.Key, asg.Address, err))
			kept = append(kept, types.GCAttachment{ContainerID: asg.Key.ContainerID, IfName: asg.Key.IfName})
			continue
		}
		req.Release = append(req.Release, api.GCTarget{Key: asg.Key, Address: asg.Address})
	}
	released := 0
	if len(req.Release) > 0 {
		resp, err := in.client.GCRelease(ctx, req)
		if err != nil {
			// Host state is gone; the addresses stay held until the next GC.
			return daemonError("gc release", api.Key{Network: in.conf.Name}, err)
		}
		released = len(resp.Released)
	}
	if err := in.gcEgress4(ctx, kept); err != nil {
		errs = append(errs, err)
	}
	in.log.Info("gc", "valid", len(req.Valid), "stale", len(plan.Released), "released", released)
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("GC released %d of %d stale attachments; could not remove the host state of the others: %v",
			released, len(plan.Released), err), "")
	}
	return nil
}

// gcLockWait is how long GC waits for a stale attachment's lock, at most
// a quarter of the GC's time left.
const gcLockWait = 5 * time.Second

// lockStale takes a stale attachment's lock (lockAttachment: its key and
// its pod's host veth names, veths) around the removal of its host state:
// a new sandbox of the pod, whose ADD replaces the veth by the same name,
// must not have it deleted between removeHostSide's look at its owner and
// the deletion. false: another invocation holds it past the wait (several
// busy ones in a row must leave the GC time for its release), and the
// attachment stays for the next GC, which is no failure.
func (in *invocation) lockStale(ctx context.Context, asg api.Assignment, veths []string) (unlock func(), ok bool) {
	var names []string
	for _, v := range veths {
		names = append(names, lockNames(asg.Key, v)...)
	}
	wait := gcLockWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/4)
	}
	unlock, skipped, err := lockAttachment(lockDir(in.conf.IPAMDSocket), names, wait)
	if err != nil {
		in.log.Info("stale attachment busy (its pod's lock is held); kept for the next GC", "key", asg.Key.String(), "address", asg.Address.String(), "error", err)
		return nil, false
	}
	if skipped != nil {
		in.log.Warn("running without the attachment lock", "key", asg.Key.String(), "error", skipped)
	}
	return unlock, true
}

// stillHolds reports whether asg's key holds its address at vpcipd now;
// true when the daemon cannot tell (the attachment then stays for the
// next GC, as before).
func (in *invocation) stillHolds(ctx context.Context, asg api.Assignment) bool {
	now, err := in.client.Check(ctx, api.CheckRequest{Key: asg.Key})
	var ae *api.Error
	switch {
	case err == nil:
		return now.Address == asg.Address
	case errors.As(err, &ae) && ae.Code == api.CodeNotFound:
		return false
	default:
		return true
	}
}

// gcOneStep is the GC of a vpcipd without /v1/gc/plan: it releases every
// stale attachment, then removes their host state.
func (in *invocation) gcOneStep(ctx context.Context, req api.GCRequest) error {
	resp, err := in.client.GC(ctx, req)
	if err != nil {
		return daemonError("gc", api.Key{Network: in.conf.Name}, err)
	}
	var errs []error
	for _, asg := range resp.Released {
		if err := delHostSide(in, asg.Address, asg.Key, in.recordedVeths(asg)...); err != nil {
			errs = append(errs, fmt.Errorf("%s (%v): %w", asg.Key, asg.Address, err))
		}
	}
	in.log.Info("gc", "valid", len(req.Valid), "released", len(resp.Released))
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("GC released %d attachments but could not remove all host state: %v", len(resp.Released), err), "")
	}
	return nil
}
