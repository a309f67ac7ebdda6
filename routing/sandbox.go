package routing

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// A host veth's name is derived from its pod's name (docs/design.md §4), so
// every sandbox of a pod gets the same one. Which sandbox a veth wires is
// therefore recorded on the veth itself, as its interface alias
// (IFLA_IFALIAS; `ip link show` prints it): "vpcip <network>/<container
// ID>/<ifname>", the CNI attachment key. The plugin writes it when it
// creates the pair, before any route leads to the veth; DEL, CHECK and GC
// touch a host veth, its route and rules only when the alias names their own
// attachment, and the daemon rebuilds lost records from it.

// sandboxAliasPrefix starts every alias the plugin writes.
const sandboxAliasPrefix = "vpcip "

// maxAlias is the kernel's limit on an interface alias (IFALIASZ 256, with
// the terminating NUL).
const maxAlias = 255

// SandboxAlias is the alias marking a host veth as the wiring of attachment
// (network, containerID, ifName). An attachment too long for an alias is
// recorded by the SHA-256 of its key, which ParseSandboxAlias cannot read
// back (it still matches exactly).
func SandboxAlias(network, containerID, ifName string) string {
	key := network + "/" + containerID + "/" + ifName
	if len(sandboxAliasPrefix)+len(key) <= maxAlias {
		return sandboxAliasPrefix + key
	}
	sum := sha256.Sum256([]byte(key))
	return sandboxAliasPrefix + "sha256:" + hex.EncodeToString(sum[:])
}

// ParseSandboxAlias reads the attachment back from an alias SandboxAlias
// wrote. ok is false for any other alias, including a hashed one. Container
// IDs and interface names never contain "/" (CNI spec), so the key is split
// from the right and a network name may hold one.
func ParseSandboxAlias(alias string) (network, containerID, ifName string, ok bool) {
	key, ok := strings.CutPrefix(alias, sandboxAliasPrefix)
	if !ok || strings.HasPrefix(key, "sha256:") {
		return "", "", "", false
	}
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return "", "", "", false
	}
	j := strings.LastIndexByte(key[:i], '/')
	if j <= 0 || j+1 == i || i+1 == len(key) {
		return "", "", "", false
	}
	return key[:j], key[j+1 : i], key[i+1:], true
}
