package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcip/vpcip/cni/datapath"
)

// IPv4 egress of IPv6 pods (docs/design.md §4): the node-local IPv4
// address comes from the reference host-local IPAM plugin, delegated to as
// a runtime chains IPAM (the binary named egress4IPAM in CNI_PATH), with a
// range of datapath.Egress4Range and a store of ours
// (Config.V4EgressDataDir/<network>/, one file per address holding its
// container ID and interface). host-local keys an allocation by
// (CNI_CONTAINERID, CNI_IFNAME), which the delegate inherits from this
// process, so DEL and GC release exactly this attachment's address.

// egress4IPAM is the delegated IPAM plugin's type.
const egress4IPAM = "host-local"

// egress4Conf is host-local's network config for this network; valid, when
// not nil, is the GC's list of valid attachments.
func (in *invocation) egress4Conf(valid []types.GCAttachment) []byte {
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       in.conf.Name,
		"ipam": map[string]any{
			"type":    egress4IPAM,
			"ranges":  [][]map[string]string{{{"subnet": datapath.Egress4Range.String()}}},
			"dataDir": in.conf.V4EgressDataDir,
		},
	}
	if valid != nil {
		conf["cni.dev/valid-attachments"] = valid
	}
	b, _ := json.Marshal(conf)
	return b
}

// egress4Used reports whether host-local ever allocated for this network on
// this node (its store exists): DEL and GC of a node that never had an
// IPv6 pod run no delegate.
func (in *invocation) egress4Used() bool {
	if !in.conf.V4Egress {
		return false
	}
	_, err := os.Stat(filepath.Join(in.conf.V4EgressDataDir, in.conf.Name))
	return err == nil
}

// allocEgress4 has host-local allocate this attachment's IPv4 egress
// address. An earlier allocation of the same attachment (an ADD retried
// without a DEL) is released first: host-local refuses a second one.
//
// A node whose CNI_PATH (cniPath) has no host-local fails the ADD saying so: the
// pod would otherwise start without the IPv4 reach its users expect.
func (in *invocation) allocEgress4(ctx context.Context, cniPath string) (netip.Addr, error) {
	if _, err := invoke.FindInPath(egress4IPAM, filepath.SplitList(cniPath)); err != nil {
		return netip.Addr{}, fmt.Errorf("IPv4 egress of IPv6 pods needs the reference %s IPAM plugin in CNI_PATH (install containernetworking/plugins, or set \"enableV4Egress\": false): %w",
			egress4IPAM, err)
	}
	conf := in.egress4Conf(nil)
	res, err := invoke.DelegateAdd(ctx, egress4IPAM, conf, nil)
	if err != nil && strings.Contains(err.Error(), "duplicate allocation") {
		if derr := invoke.DelegateDel(ctx, egress4IPAM, conf, nil); derr != nil {
			return netip.Addr{}, fmt.Errorf("%s ADD: %v; release of the earlier allocation: %w", egress4IPAM, err, derr)
		}
		res, err = invoke.DelegateAdd(ctx, egress4IPAM, conf, nil)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s ADD of an IPv4 egress address in %v: %w", egress4IPAM, datapath.Egress4Range, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s result: %w", egress4IPAM, err)
	}
	for _, ipc := range r.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && datapath.IsEgress4(a) {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%s returned no address in %v: %v", egress4IPAM, datapath.Egress4Range, r.IPs)
}

// egress4Record returns the IPv4 egress address host-local's store holds
// for this attachment: the record (one file per address, named by it)
// naming its container ID and interface. ok is false when the store holds
// none; err when the store cannot be read.
func (in *invocation) egress4Record() (addr netip.Addr, ok bool, err error) {
	dir := filepath.Join(in.conf.V4EgressDataDir, in.conf.Name)
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, err
	}
	for _, e := range entries {
		a, perr := netip.ParseAddr(e.Name())
		if perr != nil || !e.Type().IsRegular() {
			continue // host-local's lock and last-reserved files
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return netip.Addr{}, false, err
		}
		// "<id>\r\n<ifname>"; a record of an older host-local names the id alone.
		id, ifName, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if ifName = strings.TrimSpace(ifName); strings.TrimSpace(id) == in.key.ContainerID && (ifName == "" || ifName == in.key.IfName) {
			return a, true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// egress4Held reports whether host-local's store holds an address for this
// attachment (egress4Record). DEL runs the delegate only then, so a DEL of
// an attachment that never had an egress address (every IPv4 pod, an IPv6
// pod whose ADD failed before host-local) neither forks host-local nor
// fails where it is missing (a node whose store outlived its IPv6 mode).
// An unreadable store counts as held: the delegate then decides.
func (in *invocation) egress4Held() bool {
	if !in.egress4Used() {
		return false
	}
	_, ok, err := in.egress4Record()
	return ok || err != nil
}

// releaseEgress4 has host-local release this attachment's IPv4 egress
// address; none held is success (host-local's DEL is idempotent).
func (in *invocation) releaseEgress4(ctx context.Context) error {
	if err := invoke.DelegateDel(ctx, egress4IPAM, in.egress4Conf(nil), nil); err != nil {
		return fmt.Errorf("%s DEL of the IPv4 egress address: %w", egress4IPAM, err)
	}
	return nil
}

// releaseEgress4AfterDel is DEL's release of the IPv4 egress address: only
// once this attachment's host veth is gone (and the egress /32 route with
// it), so the address never goes to another pod while this one's route
// still leads to it. A failure is logged and returned.
func (in *invocation) releaseEgress4AfterDel() error {
	if !in.egress4Held() {
		return nil
	}
	own, _, err := vethOwner(in.hostVeth(), in.key)
	if err != nil {
		return err
	}
	if own == vethOurs {
		in.log.Warn("host veth still present; IPv4 egress address kept for a retried DEL", "hostVeth", in.hostVeth())
		return nil
	}
	ctx, cancel := in.ctx(in.conf.Timeouts.Release)
	defer cancel()
	if err := in.releaseEgress4(ctx); err != nil {
		in.log.Error("IPv4 egress release failed", "error", err)
		return err
	}
	return nil
}

// gcEgress4 has host-local release every egress address whose attachment
// is not in valid (the runtime's list plus the attachments GC kept).
func (in *invocation) gcEgress4(ctx context.Context, valid []types.GCAttachment) error {
	if !in.egress4Used() {
		return nil
	}
	if valid == nil {
		valid = []types.GCAttachment{}
	}
	if err := invoke.DelegateGC(ctx, egress4IPAM, in.egress4Conf(valid), nil); err != nil {
		return fmt.Errorf("%s GC of IPv4 egress addresses: %w", egress4IPAM, err)
	}
	return nil
}

// releaseReplacedEgress4 has host-local release the IPv4 egress address of
// the older sandbox of this pod whose veth ADD replaced (its egress route
// went with the veth), under that sandbox's key as the veth recorded it;
// cniPath is CNI_PATH. A failure is logged, GC reclaims it.
func (in *invocation) releaseReplacedEgress4(pair pairing, cniPath string) {
	if !pair.replaced.Veth || pair.previous.ContainerID == "" || pair.previous == in.key || !in.egress4Used() {
		return
	}
	ctx, cancel := in.ctx(in.conf.Timeouts.Release)
	defer cancel()
	err := func() error {
		bin, err := invoke.FindInPath(egress4IPAM, filepath.SplitList(cniPath))
		if err != nil {
			return err
		}
		return invoke.ExecPluginWithoutResult(ctx, bin, in.egress4Conf(nil), &invoke.Args{Command: "DEL",
			ContainerID: pair.previous.ContainerID, IfName: pair.previous.IfName, Path: cniPath}, nil)
	}()
	if err != nil {
		in.log.Warn("IPv4 egress release of the replaced sandbox failed; GC reclaims it", "sandbox", pair.previous.String(), "error", err)
	}
}
