package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// CPU time of a pod start, as the node pays it: user + system time of every
// process the runtime executed for the ADD (the plugin, and for the
// reference chain ptp and the host-local it executes), plus for vpcip the
// daemon's own CPU time over the same window (its share of the ADD: the
// socket request, the assignment and its checkpoint write, and whatever
// the daemon did in the background meanwhile, which only counts against
// us).

// childrenCPU is the user + system time of this process's terminated and
// waited-for children and, recursively, of theirs (getrusage(2)
// RUSAGE_CHILDREN). libcni waits for every plugin it executes, and ptp for
// host-local, so a delta around CNI calls is the chain's whole CPU time as
// long as no other child ends meanwhile (vpcipd and vpcsim are waited for
// only at exit).
func childrenCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is the user + system time pid has used so far, all threads,
// to the nanosecond: clock_gettime(2) on the process's CPU-time clock
// (clock id MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of the kernel's
// posix-cpu-timers; /proc/<pid>/stat counts in 10 ms ticks). 0 for pid 0 or
// a process that is gone.
func processCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	const cpuclockSched = 2
	clock := int32(^uint32(pid)<<3 | cpuclockSched)
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// cpuMeter takes CPU time deltas of the runtime's children and of one
// daemon process (pid 0: no daemon, as for the reference chain).
type cpuMeter struct {
	daemonPID int
}

// cpuSample is a point in time of a cpuMeter.
type cpuSample struct{ children, daemon time.Duration }

func (m cpuMeter) now() cpuSample {
	return cpuSample{children: childrenCPU(), daemon: processCPU(m.daemonPID)}
}

// since returns the chain's and the daemon's CPU time spent since s.
func (m cpuMeter) since(s cpuSample) (chain, daemon time.Duration) {
	n := m.now()
	return n.children - s.children, n.daemon - s.daemon
}

// conntrackWalks is how many dumps conntrackWalk averages over.
const conntrackWalks = 20

// conntrackWalk is the CPU time of one dump of the conntrack table from
// the node netns, as vpcipd makes for each batch of released addresses it
// flushes before reuse (the kernel keeps one hash for every netns and has no
// index by address, so each dump walks all of it). It is measured on this
// process's own CPU clock, on a thread in the node netns.
func conntrackWalk(netnsName string) (time.Duration, error) {
	nodeNS, err := ns.GetNS(filepath.Join(podruntime.NetnsDir, netnsName))
	if err != nil {
		return 0, err
	}
	defer nodeNS.Close()
	var spent time.Duration
	err = nodeNS.Do(func(ns.NetNS) error {
		start := threadCPU()
		for range conntrackWalks {
			if _, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET); err != nil {
				return fmt.Errorf("dump conntrack table: %w", err)
			}
		}
		spent = threadCPU() - start
		return nil
	})
	return spent / conntrackWalks, err
}

// threadCPU is the calling thread's CPU time (user + system).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
