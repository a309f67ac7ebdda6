package plugin

// stackIndex is never changed; indexing with it keeps the compiler from
// dropping GrowStack's array.
var stackIndex int

// GrowStack gives the calling goroutine a 128 KiB stack in one step, while
// its stack is still shallow. The netlink package receives into a 64 KiB
// array on the stack, and JSON decoding recurses: without this, a goroutine
// of the plugin doubles its stack from 8 KiB several times, each time
// copying it frame by frame (~0.1M instructions for the main goroutine and
// the one creating the veth pair). A short-lived process never shrinks it
// back (that happens during garbage collection, which an ADD never reaches).
//
//go:noinline
func GrowStack() byte {
	var b [64 << 10]byte
	b[stackIndex] = 1
	return b[stackIndex+1]
}
