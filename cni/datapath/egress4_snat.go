package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/coreos/go-iptables/iptables"
)

// ChainEgress4 is the nat chain that SNATs IPv6 pods' IPv4 egress
// (Egress4Range) leaving the node: jumped to from POSTROUTING for sources
// in the range, it returns for destinations in the range (another pod's
// egress address, which stays on the node) and masquerades the rest, so
// the packet leaves with the address of the interface it leaves by, the
// primary ENI's primary IPv4 address on a node whose default route is the
// primary ENI (every IPv6-mode node: the daemon assigns from the primary
// ENI only). MASQUERADE rather than SNAT to a given address: the plugin
// does not know the node's primary address, and the range is never routed
// off the node, so there is no other interface to get wrong. Shared by all
// pods and never removed by DEL (an empty range matches nothing).
const ChainEgress4 = "VPCIP-EGRESS4"

// egress4Comment marks our rules for iptables-save readers.
const egress4Comment = "vpcip: IPv4 egress of IPv6 pods"

// EnsureEgress4SNAT makes ChainEgress4 and its POSTROUTING jump exist in the
// current netns (the node's), once however many plugins run at a time:
// check-then-add is serialized by an exclusive flock on lockPath (created
// with its directory when missing), as iptables' own lock covers only one
// command. Once the POSTROUTING jump exists (added last) nothing else is
// checked: a rule deleted by hand from the chain is not restored while the
// jump stays. Errors name the rule that could not be read or added.
func EnsureEgress4SNAT(lockPath string) error {
	ipt, err := iptables.New()
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return fmt.Errorf("IPv4 egress lock: %w", err)
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("IPv4 egress lock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("IPv4 egress lock %s: %w", lockPath, err)
	}
	const table = "nat"
	rng := Egress4Range.String()
	cm := []string{"-m", "comment", "--comment", egress4Comment}
	jump := append([]string{"-s", rng}, append(cm, "-j", ChainEgress4)...)
	// The jump is added last, so its presence means the chain is complete:
	// every ADD after the node's first runs this one check.
	if ok, err := ipt.Exists(table, "POSTROUTING", jump...); err == nil && ok {
		return nil
	}
	exists, err := ipt.ChainExists(table, ChainEgress4)
	if err != nil {
		return fmt.Errorf("iptables -t nat -L %s: %w", ChainEgress4, err)
	}
	if !exists {
		if err := ipt.NewChain(table, ChainEgress4); err != nil {
			return fmt.Errorf("iptables -t nat -N %s: %w", ChainEgress4, err)
		}
	}
	rules := []struct {
		chain string
		spec  []string
	}{
		{ChainEgress4, append([]string{"-d", rng}, append(cm, "-j", "RETURN")...)},
		{ChainEgress4, append(cm, "-j", "MASQUERADE")},
		{"POSTROUTING", jump},
	}
	// In order, so the jump exists only once the chain is complete.
	for _, r := range rules {
		if err := ipt.AppendUnique(table, r.chain, r.spec...); err != nil {
			return fmt.Errorf("iptables -t nat -A %s %v: %w", r.chain, r.spec, err)
		}
	}
	return nil
}
