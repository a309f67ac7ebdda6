package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/routing"
)

// Identity is the alias that marks a host veth as key's sandbox
// (routing.SandboxAlias: the veth's name is the pod's, the same for every
// sandbox of it; the alias tells them apart).
func Identity(key api.Key) string {
	return routing.SandboxAlias(key.Network, key.ContainerID, key.IfName)
}

// ownership is what a host veth's alias says about a key.
type ownership int

const (
	vethMissing  ownership = iota // no such link
	vethOurs                      // the alias names the key
	vethUnmarked                  // no alias: made before sandboxes were recorded; judged by name
	vethOther                     // the alias names another sandbox
)

// vethOwner reads which sandbox the host veth named name wires.
func vethOwner(name string, key api.Key) (ownership, string, error) {
	if name == "" {
		return vethMissing, "", nil
	}
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return vethMissing, "", nil
		}
		return vethMissing, "", fmt.Errorf("find host veth %s: %w", name, err)
	}
	own, alias := ownerOf(link.Attrs().Alias, key)
	return own, alias, nil
}

// ownerOf is what a present host veth's alias says about key, and the
// alias when it names another sandbox.
func ownerOf(alias string, key api.Key) (ownership, string) {
	switch alias {
	case Identity(key):
		return vethOurs, alias
	case "":
		return vethUnmarked, ""
	default:
		return vethOther, alias
	}
}

// sandboxOf is the attachment of this network a host veth's alias records
// when it is another sandbox's, or the zero Key.
func (in *invocation) sandboxOf(alias string) api.Key {
	if own, _ := ownerOf(alias, in.key); own != vethOther {
		return api.Key{}
	}
	n, id, ifn, ok := routing.ParseSandboxAlias(alias)
	if !ok || n != in.key.Network {
		return api.Key{}
	}
	return api.Key{Network: n, ContainerID: id, IfName: ifn}
}

// ownVeth is the host veth name to send the daemon for matching a re-held
// assignment (api.ReleaseRequest.HostVeth): the attachment's veth when it
// is marked as this key's or unmarked, "" when it wires another sandbox of
// the same pod (adopting by name would hand that sandbox's address to this
// key, then free it).
func (in *invocation) ownVeth() string {
	own, alias, err := vethOwner(in.hostVeth(), in.key)
	switch {
	case err != nil:
		in.log.Warn("cannot read the host veth's sandbox", "error", err)
		return ""
	case own == vethOther:
		in.log.Info("host veth wires another sandbox of this pod", "hostVeth", in.hostVeth(), "sandbox", alias)
		return ""
	case own == vethMissing:
		return ""
	}
	return in.hostVeth()
}
