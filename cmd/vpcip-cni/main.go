// Command vpcip-cni is the vpcip CNI plugin, executed by the container
// runtime with CNI_COMMAND=ADD, DEL, CHECK, GC, STATUS or VERSION and the
// network config on stdin. It asks vpcipd for addresses over its unix socket
// and wires routed veths; see package cni/plugin.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/vpcip/vpcip/cni/plugin"
)

func main() {
	p := &plugin.Plugin{}
	skel.PluginMainFuncs(p.Funcs(), plugin.Versions, plugin.About)
}
