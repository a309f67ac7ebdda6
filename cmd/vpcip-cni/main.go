// Command vpcip-cni is the vpcip CNI plugin, executed by the container
// runtime with CNI_COMMAND=ADD, DEL, CHECK, GC, STATUS or VERSION and the
// network config on stdin. It asks vpcipd for addresses over its unix socket
// and wires routed veths; see package cni/plugin.
package main

import (
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/vpcip/vpcip/cni/plugin"
)

func main() {
	tuneRuntime()
	p := &plugin.Plugin{}
	skel.PluginMainFuncs(p.Funcs(), plugin.Versions, plugin.About)
}

// tuneRuntime fits the Go runtime to a process that lives a few
// milliseconds and mostly waits on the kernel and the daemon, and of which
// a burst of pod starts runs dozens at once on a node's few cores:
//
//   - one P (unless GOMAXPROCS is set): with more, every goroutine wake-up
//     (the daemon's answer, the veth pair being made meanwhile) starts a
//     spinning thread looking for work; measured ~1 ms of CPU per ADD on a
//     2-core node (user+sys, 100 ADDs), while blocking syscalls still hand
//     the P over, so the pair and the daemon call still overlap;
//   - the main goroutine's stack grown once, while shallow
//     (plugin.GrowStack).
//
// The garbage collector is left on: an ADD allocates less than the first
// GC target (4 MiB), so it never runs.
func tuneRuntime() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	plugin.GrowStack()
}
