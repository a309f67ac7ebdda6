// Package ipamd is vpcipd, the node daemon: it keeps the node's warm pool of
// VPC addresses on ENIs, hands them to pods over the plugin API (package api,
// HTTP/JSON on a unix socket), persists every assignment in a checkpoint, and
// reconciles its view with the cloud and the host.
//
// # Parts
//
// Daemon is only the wiring: New builds the parts below, Run starts their
// goroutines under one errgroup. Each part owns its state; a part's lock
// guards only that part's fields and is never held across a cloud or
// netlink call (the checkpointer's lock spans the file write it serializes).
//
//	part           file             owns                                                 runs on                  lock
//	datastore      datastore/       ENIs, slots, assignments, cooldown, conntrack        any goroutine            its own mutex
//	                                 flush marks
//	conntrackFlusher conntrack.go   pending conntrack flushes: one dump for all           its own goroutine;       mu: the pending
//	                                 addresses due in a window (cooldown over, new)        ADDs wait on it          requests only
//	checkpointer   persist.go       the checkpoint file: load, foreign-instance check,   any goroutine            mu: serializes writes
//	                                 folded writes
//	nodeInfo       node.go          instance identity and limits (MAX_ENI applied)       written by the worker,   none (atomic pointer
//	                                                                                      read by all              to an immutable value)
//	lifecycle      lifecycle.go     readiness, the not-ready reason, shutdown            worker sets, all read    mu: the reason only
//	pool.Pool      pool/            plan (warmpool) and execute (provider), cloud        the worker               mu: refusals, strikes,
//	                                 refusals and backoff, release pacing                                          last release
//	hostSync       hostsync*.go     ENI links and host-setup errors, SNAT, pod routes    the worker (status       mu: links and errors;
//	                                 and stale pod rules, route-less releases, the one    reads links, errors)     noRoute is worker-only
//	                                 ENI→hostnet conversion
//	reconciler     reconcile.go     start-up, metadata/EC2 reconciliation, missing-ENI   the worker               none (worker-only)
//	                                 counts, leaked-ENI sweep
//	goneReleaser   kubernetes.go    releases of pods the Kubernetes part found gone,     the worker               none (worker-only)
//	                                 through hostSync's release path
//	worker         worker.go        the loop: timers, kicks, calls run on it             its own goroutine        none
//	apiServer      assign.go,       the plugin API: assign, release, check, GC, status;  socket server            none (waiting ADDs
//	               server.go        the count of waiting ADDs (the pool's demand)        goroutines               are an atomic)
//	statusView     status.go        nothing: api.Counts, status, Snapshot and            any goroutine            none
//	                                 introspection from the parts
//	Metrics        metrics.go       Prometheus counters and the pool gauges              any goroutine            none (prometheus types)
//
// The worker goroutine makes every cloud call: it restores state at start
// (checkpoint, then EC2, then host routes), then loops: pool cycles
// (snapshot → warmpool.Next → provider → host → datastore → checkpoint),
// woken by a timer and by a capacity-1 kick channel; reconciliation against
// instance metadata, confirmed by EC2; the leaked-ENI sweep. The socket
// server's goroutines touch only the datastore and the checkpoint; an ADD
// that finds the pool empty kicks the worker and waits a bounded time. The
// metrics and introspection HTTP servers are read-only.
//
// # The Kubernetes part's seats
//
// The Kubernetes part (package ipamd/cluster) is built first and handed to
// New; nothing is set after construction. It fills three seats, and imports
// none of the daemon's internals to do so:
//
//   - Options.Pods (PodFacts), facts flowing in: the pods bound to the node
//     that hold no address (the pool's demand, read every cycle as
//     warmpool's Demand.Unaddressed), the attachments whose pod the API
//     server confirmed gone, and a change signal that wakes the worker. The
//     worker releases gone pods' addresses through hostSync's one release
//     path for pods gone without a DEL (pod rules first, then the address),
//     only while no host route leads to the address.
//   - Options.Status (StatusSink), status flowing out: a nodestatus.Snapshot
//     after every worker pass, with the attachments held. The part renders
//     the AddressBudget from it and judges leaks by it.
//   - Options.Events (NoAddressRecorder): why an ADD got no address.
//
// All are nil by default, and the daemon works without them.
//
// # Pool counts
//
// The pool's numbers are one api.Counts, computed in one place
// (statusView.counts); the status endpoint, introspection, the pool
// gauges, the awscni_* gauges and the AddressBudget render it. ENIs count
// pod ENIs, on the same basis as MaxENIs: under custom networking the
// primary ENI holds no pod address and is counted in neither.
//
// # Timing
//
// EC2 calls at idle (B08): reconciliation runs every VPCIP_RECONCILE_INTERVAL
// (60 s) and reads instance metadata only, calling EC2 DescribeNetworkInterfaces
// only when metadata disagrees with the datastore; an authoritative EC2 re-read
// runs every VPCIP_RESYNC_INTERVAL (5 m) and the leaked-ENI sweep every
// VPCIP_LEAK_SWEEP_INTERVAL (5 m), each jittered ±25 %. An idle node therefore
// makes at most 2 EC2 calls per 5 minutes. Start-up makes one batched Describe.
// Cloud refusals back off exponentially with jitter, per kind.
//
// Shrinking (B09): surplus is given back at most once per
// VPCIP_RELEASE_INTERVAL (30 s), one release of free addresses or one ENI
// deletion at a time, only under WARM_IP_TARGET/MINIMUM_IP_TARGET or surplus
// whole ENIs; after a burst that left k surplus ENIs the pool is at target
// within k+1 intervals once the released addresses are out of cooldown.
//
// New wires and does no I/O; Run works until its context ends, then stops
// making cloud changes, finishes in-flight requests and writes the checkpoint.
package ipamd
