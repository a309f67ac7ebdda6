package ipamd

import (
	"sync/atomic"

	"github.com/vpcip/vpcip/ipamd/pool"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// nodeInfo is the node's identity and limits: written by the worker when
// start-up learns the instance, read by every part. It holds an immutable
// value behind an atomic pointer, so it needs no lock.
type nodeInfo struct {
	v atomic.Pointer[nodeFacts]
}

// nodeFacts are what the cloud says about this node.
type nodeFacts struct {
	self   provider.Instance
	limits warmpool.Limits // MaxENIs already capped by MAX_ENI
}

var _ pool.Node = (*nodeInfo)(nil)

// set records the instance and its limits.
func (n *nodeInfo) set(self provider.Instance, lim warmpool.Limits) {
	n.v.Store(&nodeFacts{self: self, limits: lim})
}

// get returns the instance and limits; zero values before start-up set them.
func (n *nodeInfo) get() (provider.Instance, warmpool.Limits) {
	if f := n.v.Load(); f != nil {
		return f.self, f.limits
	}
	return provider.Instance{}, warmpool.Limits{}
}

// Limits implements pool.Node.
func (n *nodeInfo) Limits() warmpool.Limits {
	_, lim := n.get()
	return lim
}

// SubnetID implements pool.Node: the primary ENI's subnet.
func (n *nodeInfo) SubnetID() string {
	self, _ := n.get()
	return self.SubnetID
}

// nodeLimits are the pool's limits for an instance type's: the ENIs that
// hold pods (provider.Limits.PodENIs: MaxENIs capped by MAX_ENI when maxENI
// > 0, minus the primary under custom networking), pods capped by
// VPCIP_MAX_PODS.
func nodeLimits(lim provider.Limits, maxENI, maxPods int, customNetworking bool) warmpool.Limits {
	return warmpool.Limits{MaxENIs: lim.PodENIs(maxENI, customNetworking), SlotsPerENI: lim.PodAddressesPerENI(), MaxPods: maxPods, PrefixSupported: lim.PrefixDelegation}
}
