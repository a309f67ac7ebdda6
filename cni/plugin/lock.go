package plugin

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/ipamd/api"
)

// lockBuckets is how many lock files the plugin's attachment locks share
// (by a hash of the key): bounded files in a tmpfs however many pods a node
// runs over its life; two attachments of one bucket only take turns.
const lockBuckets = 4096

// lockPoll is how often a blocked invocation tries the lock again.
const lockPoll = 10 * time.Millisecond

// errLockWait is returned when the lock was not had within the wait.
var errLockWait = errors.New("another ADD, DEL or CHECK of this attachment is still running")

// lockDir is where the attachment locks live: beside vpcipd's socket
// (/run/vpcip/cni-locks with the default socket), in the node's runtime
// directory, emptied at boot.
func lockDir(socket string) string {
	return filepath.Join(filepath.Dir(socket), "cni-locks")
}

// bucketOf is the lock file of key: a hash of the key, below lockBuckets.
func bucketOf(key api.Key) uint16 {
	sum := sha256.Sum256([]byte(key.Network + "\x00" + key.ContainerID + "\x00" + key.IfName))
	return binary.BigEndian.Uint16(sum[:2]) % lockBuckets
}

// lockAttachment serializes the plugin's ADD, DEL and CHECK of one
// attachment on the node. The CNI spec (1.1, §Lifecycle) forbids a runtime
// to run them in parallel for one container, but an invocation its runtime
// timed out may still run when the next comes; in parallel, a DEL (or a
// failed ADD's undo) could release an address while the other wires it,
// and the address would then be handed to a second pod. The lock is an
// flock(2) on one of lockBuckets files in dir, so the kernel drops it when
// the holder dies (kill -9). It waits up to wait, then returns an error
// wrapping errLockWait. The returned unlock is never nil.
//
// A lock that cannot be had for another reason (the directory cannot be
// made: a read-only mount) is not an error: the invocation runs without
// it, as before the lock existed, and the error is returned in skipped
// for the log.
func lockAttachment(dir string, key api.Key, wait time.Duration) (unlock func(), skipped, err error) {
	noop := func() {}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return noop, err, nil
	}
	name := filepath.Join(dir, fmt.Sprintf("%03x", bucketOf(key)))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return noop, err, nil
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil, nil // closing drops the lock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return noop, fmt.Errorf("flock %s: %w", name, err), nil
		}
		if time.Now().After(deadline) {
			f.Close()
			return noop, nil, fmt.Errorf("%w (waited %v for %s)", errLockWait, wait, name)
		}
		time.Sleep(lockPoll)
	}
}
