package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/routing"
)

// Del is CNI DEL. It always releases the address by key, whether or not a
// netns is given (B01) or still exists (B25), and succeeds when anything is
// already gone (B14). When vpcipd cannot answer (unreachable, not ready, or
// out of time), it removes the host side from what it knows locally
// (prevResult, the pod interface it just deleted) and succeeds, so the
// runtime finishes the sandbox and the pod does not stay Terminating while
// the daemon is down (B13); vpcipd releases the address itself once it
// runs again: its host check (route and netns gone), a CNI GC, or the
// pod's deletion in the Kubernetes API. A host side it could not remove,
// or a daemon that answered with an error, fails the DEL.
//
// The host side of the address the key holds is removed before the release,
// while no other pod can have been given the address: released first, with
// IP_COOLDOWN_PERIOD=0 the next ADD gets it at once, and the removal (which
// looks for the host route, then deletes the route and the rules of the
// address) could delete that pod's route and rules. A removal that fails
// keeps the address held and fails the DEL, which the runtime retries.
//
// A config whose network name cannot be read is an error (code 7): without
// it the attachment key cannot be formed. A key the daemon refuses
// (api.Key.Check: a container ID or network name over 256 bytes) can hold
// nothing, as every ADD of it was refused: its DEL succeeds at once.
//
// An IPv6 attachment's IPv4 egress address (egress4.go) is released last,
// once its host veth is gone, whatever the daemon answered.
func (p *Plugin) Del(args *skel.CmdArgs) (rerr error) {
	in, err := start("DEL", args, true)
	if errors.Is(err, errKeyHoldsNothing) {
		return nil
	}
	if err != nil {
		return err
	}
	defer in.close()
	defer func() {
		if err := in.releaseEgress4AfterDel(); err != nil && rerr == nil {
			rerr = types.NewError(types.ErrInternal, fmt.Sprintf("DEL %s: %v", in.key, err), "")
		}
	}()

	// The daemon's record and the pod interface's removal are independent:
	// the daemon answers while the kernel deletes the veth.
	held := make(chan heldAnswer, 1)
	go func() { held <- in.held() }()
	var errs []error
	var podAddrs []netip.Addr
	if args.Netns != "" {
		podAddrs, err = datapath.DeletePodInterface(args.Netns, args.IfName, Identity(in.key))
		switch {
		case errors.Is(err, datapath.ErrNetnsGone):
			in.log.Warn("pod netns gone; releasing anyway", "error", err)
		case errors.Is(err, datapath.ErrNotOwned):
			// Another sandbox's interface (a DEL with a wrong container ID
			// or netns): neither it nor its addresses are this key's.
			in.log.Warn("pod interface is not this sandbox's; left alone", "error", err)
		case err != nil:
			errs = append(errs, err)
		}
	}
	h := <-held
	var ae *api.Error
	switch {
	case h.err == nil:
		return in.delHeld(args, h.asg, podAddrs, errs)
	case !errors.As(h.err, &ae) || (ae.Code != api.CodeNotFound && ae.Code != api.CodeNotReady):
		return in.delWithoutDaemon(args, podAddrs, "lookup", h.err, errs)
	}
	// Not held, as far as the daemon knows yet (unknown key, released
	// earlier, or a daemon still restoring): the release settles it.
	r := in.release()
	switch {
	case r.err == nil && r.resp.Assignment != nil:
		// Held after all (the daemon finished restoring, or matched a
		// recovered assignment to the key meanwhile): released already.
		in.log.Info("released", "address", r.resp.Assignment.Address.String())
		asg := r.resp.Assignment
		errs = append(errs, delHostSide(in, asg.Address, in.key, in.owners(asg)...))
		for _, a := range localAddrs(in, args.IfName, podAddrs) {
			if a != asg.Address {
				errs = append(errs, delHostSide(in, a, in.key, in.owners(nil)...))
			}
		}
	case r.err == nil:
		// Unknown key, or released earlier (GC): host state can only be
		// known locally, and is removed only where it is this pod's.
		local := localAddrs(in, args.IfName, podAddrs)
		in.log.Info("nothing to release; key unknown or already released", "localAddresses", fmt.Sprint(local))
		errs = append(errs, delLocalHostSide(in, local, podAddrs)...)
	default:
		return in.delWithoutDaemon(args, podAddrs, "release", r.err, errs)
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("DEL %s: %v", in.key, err), "")
	}
	return nil
}

// delHeld is DEL of a key the daemon holds asg for: its host side goes
// while the key still holds the address, then the release (see Del).
// podErrs are the pod interface's removal failures, reported after the
// release (the host side decides whether the address may go).
func (in *invocation) delHeld(args *skel.CmdArgs, asg api.Assignment, podAddrs []netip.Addr, podErrs []error) error {
	var errs []error
	errs = append(errs, delHostSide(in, asg.Address, in.key, in.owners(&asg)...))
	// The pod's own address, when the daemon's record names another
	// (a damaged checkpoint): its rules go too.
	for _, a := range localAddrs(in, args.IfName, podAddrs) {
		if a != asg.Address {
			errs = append(errs, delHostSide(in, a, in.key, in.owners(nil)...))
		}
	}
	if err := errors.Join(errs...); err != nil {
		in.log.Error("host side not removed; the address stays held for a retried DEL", "address", asg.Address.String(), "error", err)
		return types.NewError(types.ErrInternal, fmt.Sprintf("DEL %s: %v; %v stays held until its host state is removed", in.key, err, asg.Address), "")
	}
	r := in.release()
	if r.err != nil {
		cerr := daemonError("release", in.key, r.err)
		if daemonDown(r.err) && len(podErrs) == 0 {
			// B13, as in delWithoutDaemon: the host side is gone, vpcipd
			// releases the address once it runs again.
			in.log.Warn("release failed after the host side was removed: vpcipd down; DEL succeeds and vpcipd releases the address once it runs",
				"address", asg.Address.String(), "error", cerr.Msg)
			return nil
		}
		in.log.Error("release failed after the host side was removed", "address", asg.Address.String(), "error", cerr.Msg)
		cerr.Msg += "; host routes and rules removed, the address is released when vpcipd answers a retried DEL or its GC"
		return cerr
	}
	if r.resp.Assignment != nil {
		in.log.Info("released", "address", r.resp.Assignment.Address.String())
	} else {
		in.log.Info("released meanwhile by vpcipd", "address", asg.Address.String())
	}
	if err := errors.Join(podErrs...); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("DEL %s: %v", in.key, err), "")
	}
	return nil
}

// heldAnswer is the daemon's record of the key (CHECK).
type heldAnswer struct {
	asg api.Assignment
	err error
}

// held asks the daemon what the key holds, without releasing it; like the
// release it matches a recovered assignment by the attachment's host veth.
func (in *invocation) held() heldAnswer {
	ctx, cancel := in.ctx(in.conf.Timeouts.Check)
	defer cancel()
	asg, err := in.client.Check(ctx, api.CheckRequest{Key: in.key, HostVeth: in.ownVeth(),
		Pod: api.Pod{Namespace: in.pod.Namespace, Name: in.pod.Name, UID: in.pod.UID}})
	return heldAnswer{asg, err}
}

type releaseAnswer struct {
	resp api.ReleaseResponse
	err  error
}

func (in *invocation) release() releaseAnswer {
	ctx, cancel := in.ctx(in.conf.Timeouts.Release)
	defer cancel()
	resp, err := in.client.Release(ctx, api.ReleaseRequest{Key: in.key, HostVeth: in.ownVeth()})
	return releaseAnswer{resp, err}
}

// delWithoutDaemon handles a lookup (op "lookup": the daemon's record of
// the key, asked first) or a release (op "release") the daemon did not
// answer (or refused): it removes the host side from local knowledge.
// An address known from prevResult alone loses its host side only where
// its host route leads to this attachment's veth (delUnknownHostSide).
// With the daemon unreachable, not ready or out of time it then succeeds
// (B13): the address stays held in vpcipd's records, whose host check
// removes what is left of its host side (rules) before it gives the
// address to another pod. A daemon that refused, a host side that could
// not be removed, or a DEL with neither netns nor prevResult (nothing
// local knows the pod's host side) fails with the daemon's error (code 11
// when retryable), for the runtime to retry.
func (in *invocation) delWithoutDaemon(args *skel.CmdArgs, podAddrs []netip.Addr, op string, relErr error, errs []error) error {
	local := localAddrs(in, args.IfName, podAddrs)
	errs = append(errs, delLocalHostSide(in, local, podAddrs)...)
	cerr := daemonError(op, in.key, relErr)
	hostErr := errors.Join(errs...)
	// Without a netns and without prevResult nothing local tells the
	// pod's host side: the DEL fails (code 11) for the runtime to retry
	// once the daemon answers, rather than leave the pod wired.
	known := args.Netns != "" || len(local) > 0
	if hostErr == nil && known && daemonDown(relErr) {
		in.log.Warn(op+" failed: vpcipd down; host side removed from local knowledge, DEL succeeds and vpcipd releases the address once it runs",
			"addresses", fmt.Sprint(local), "error", cerr.Msg)
		return nil
	}
	in.log.Error(op+" failed; host side removed from local knowledge", "addresses", fmt.Sprint(local), "error", cerr.Msg)
	if hostErr != nil {
		cerr.Details = hostErr.Error()
	}
	cerr.Msg += "; the address is released when vpcipd answers a retried DEL or its GC"
	return cerr
}

// delLocalHostSide removes the host side of addresses known locally, not
// from the daemon's record: one on the sandbox's own pod interface
// (podAddrs) is this sandbox's; one known from prevResult alone only where
// its host route leads to this attachment's veth (delUnknownHostSide: a
// stale DEL must not strip a live pod's rules; the rest is left to
// vpcipd).
func delLocalHostSide(in *invocation, local, podAddrs []netip.Addr) []error {
	var errs []error
	for _, a := range local {
		if slices.Contains(podAddrs, a) {
			errs = append(errs, delHostSide(in, a, in.key, in.owners(nil)...))
			continue
		}
		errs = append(errs, delUnknownHostSide(in, a, in.key, in.owners(nil)...))
	}
	return errs
}

// daemonDown reports whether err means vpcipd could not answer: its socket
// unreachable, its answer late, or the daemon still restoring its state.
func daemonDown(err error) bool {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code == api.CodeNotReady
	}
	return errors.Is(err, api.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded)
}

// localAddrs is what the node knows of the attachment's addresses without
// the daemon: prevResult and the pod interface DEL just removed.
func localAddrs(in *invocation, ifName string, podAddrs []netip.Addr) []netip.Addr {
	local := slices.Concat(prevResultAddrs(in.conf, ifName, in.log), podAddrs)
	// An IPv6 pod's IPv4 egress address is host-local's, not the daemon's:
	// its route goes with the veth, its release is releaseEgress4AfterDel.
	local = slices.DeleteFunc(local, datapath.IsEgress4)
	slices.SortFunc(local, netip.Addr.Compare)
	return slices.Compact(local)
}

// removeHostSide removes the host route, rules and veth of addr when they
// are key's (its conntrack entries are vpcipd's to flush, before it hands
// the address out again): the route is gone (rules left over), or it leads to a veth marked as
// key's sandbox (Identity), or to an unmarked veth (made before veths were
// marked) named as one of owners, the names the attachment may have (from
// this call's CNI_ARGS, and from the pod the daemon recorded at ADD). An
// address routed to any other veth belongs to a live sandbox and is left
// alone, whatever the daemon answered: its record may be wrong (a damaged
// checkpoint), the call may be a stale DEL of an older sandbox of the same
// pod, and tearing down a live sandbox's wiring is worse than a leftover rule.
//
// An address the host routes to another sandbox's veth is that sandbox's:
// nothing is removed and errRoutedElsewhere comes back. DEL takes that as
// done (delHostSide); GC keeps the attachment held and reports it.
func removeHostSide(in *invocation, addr netip.Addr, key api.Key, owners ...string) error {
	if !addr.IsValid() {
		return nil
	}
	log := in.log
	link, err := datapath.HostRouteLink(addr)
	if err != nil {
		return err
	}
	if link != "" {
		own, alias, err := vethOwner(link, key)
		if err != nil {
			return err
		}
		if own == vethOther || (own == vethUnmarked && !slices.Contains(owners, link)) {
			log.Warn("address routed to another sandbox's veth; leaving its host state alone", "address", addr.String(),
				"link", link, "sandbox", alias, "owners", owners)
			return fmt.Errorf("%w: %v via %s (%q)", errRoutedElsewhere, addr, link, alias)
		}
	}
	var errs []error
	if link != "" {
		if _, err := datapath.DeleteHostVeth(link); err != nil {
			errs = append(errs, err)
		}
		if err := datapath.RemoveHostRoute(addr, link); err != nil {
			errs = append(errs, err)
		}
	} else if now, err := datapath.HostRouteLink(addr); err == nil && now != "" {
		// No route when looked at, one now: a new sandbox's ADD of the
		// address (released meanwhile) made it, and makes its rules after
		// it. Its route and rules are its own.
		log.Warn("address routed since the check; leaving its host state alone", "address", addr.String(), "link", now)
		return fmt.Errorf("%w: %v via %s", errRoutedElsewhere, addr, now)
	}
	n, err := routing.RemovePodRules(addr)
	if err != nil {
		errs = append(errs, err)
	}
	log.Debug("host side removed", "address", addr.String(), "rules", n, "routeLink", link)
	return errors.Join(errs...)
}

// errRoutedElsewhere: the address is routed to another sandbox's veth; its
// host state belongs to that sandbox and was left alone.
var errRoutedElsewhere = errors.New("routed to another sandbox's veth")

// delHostSide is removeHostSide for DEL: an address routed to another
// sandbox is not this attachment's to clean, and DEL succeeds.
func delHostSide(in *invocation, addr netip.Addr, key api.Key, owners ...string) error {
	if err := removeHostSide(in, addr, key, owners...); !errors.Is(err, errRoutedElsewhere) {
		return err
	}
	return nil
}

// delUnknownHostSide is delHostSide for a DEL whose key the daemon does not
// hold (a stale or repeated DEL) and an address known only from its
// prevResult (the sandbox's netns is gone): the address may be another pod's,
// whose ADD has made its rules but not yet its route (or whose route an
// admin deleted). So without a host route to this attachment's veth nothing
// is removed: the policy rules of an address nobody holds are removed by
// vpcipd's stale-rule check, which fences the address meanwhile.
func delUnknownHostSide(in *invocation, addr netip.Addr, key api.Key, owners ...string) error {
	link, err := datapath.HostRouteLink(addr)
	if err != nil {
		return err
	}
	if link == "" {
		in.log.Info("no host route to the address of an unknown key; its rules are left to vpcipd", "address", addr.String())
		return nil
	}
	return delHostSide(in, addr, key, owners...)
}
