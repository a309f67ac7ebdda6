package plugin

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/ipamd/api"
)

// lockBuckets is how many lock files the plugin's locks share (by a hash
// of each lock's name, bucketOf): bounded files in a tmpfs however many
// pods a node runs over its life; two attachments of one bucket only take
// turns.
const lockBuckets = 4096

// lockPoll is how often a blocked invocation tries the lock again.
const lockPoll = 10 * time.Millisecond

// errLockWait is returned when the lock was not had within the wait.
var errLockWait = errors.New("another ADD, DEL or CHECK of this attachment or another sandbox of its pod is still running")

// lockDir is where the attachment locks live: beside vpcipd's socket
// (/run/vpcip/cni-locks with the default socket), in the node's runtime
// directory, emptied at boot.
func lockDir(socket string) string {
	return filepath.Join(filepath.Dir(socket), "cni-locks")
}

// bucketOf is the lock file of name: a hash of it, below lockBuckets.
func bucketOf(name string) uint16 {
	sum := sha256.Sum256([]byte(name))
	return binary.BigEndian.Uint16(sum[:2]) % lockBuckets
}

// lockNames are what an invocation of key locks: the attachment itself
// and its host veth's name, which every sandbox of the pod shares (an ADD
// of a new sandbox replaces the veth an older sandbox's ADD may still be
// wiring).
func lockNames(key api.Key, hostVeth string) []string {
	return []string{"key\x00" + key.Network + "\x00" + key.ContainerID + "\x00" + key.IfName, "veth\x00" + hostVeth}
}

// lockAttachment serializes the plugin's ADD, DEL and CHECK of one
// attachment, and of the sandboxes of one pod, on the node. The CNI spec
// (1.1, §Lifecycle) forbids a runtime to run them in parallel for one
// container, but an invocation its runtime timed out may still run when
// the next comes, or when the runtime makes the pod a new sandbox; in
// parallel, a DEL (or a failed ADD's undo) could release an address while
// the other wires it, or one ADD replace the veth the other just wired,
// and the address would then be handed to a second pod. Each of names
// (lockNames) takes an flock(2) on one of lockBuckets files in dir, in the
// files' order (so two invocations never wait on each other), and the
// kernel drops them when the holder dies (kill -9). It waits up to wait
// in all, then returns an error wrapping errLockWait. The returned unlock
// is never nil.
//
// A lock that cannot be had for another reason (the directory cannot be
// made: a read-only mount) is not an error: the invocation runs without
// it, as before the lock existed, and the error is returned in skipped
// for the log.
func lockAttachment(dir string, names []string, wait time.Duration) (unlock func(), skipped, err error) {
	noop := func() {}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return noop, err, nil
	}
	var buckets []uint16
	for _, n := range names {
		buckets = append(buckets, bucketOf(n))
	}
	slices.Sort(buckets)
	buckets = slices.Compact(buckets)
	var held []*os.File
	release := func() {
		for _, f := range held {
			f.Close() // closing drops the lock
		}
	}
	deadline := time.Now().Add(wait)
	for _, b := range buckets {
		f, err := lockFile(filepath.Join(dir, fmt.Sprintf("%03x", b)), deadline)
		if err != nil {
			release()
			if errors.Is(err, errLockWait) {
				return noop, nil, fmt.Errorf("%w (waited %v)", err, wait)
			}
			return noop, err, nil
		}
		held = append(held, f)
	}
	return release, nil, nil
}

// lockFile takes an exclusive flock on the file name, trying until
// deadline; errLockWait when it is still held then.
func lockFile(name string, deadline time.Time) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", name, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%w: %s", errLockWait, name)
		}
		time.Sleep(lockPoll)
	}
}
