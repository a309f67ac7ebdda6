// Package netnsdir creates and deletes named network namespaces under
// /run/netns (the names `ip netns` uses) so that several processes can do it
// at once on a fresh machine.
//
// `ip netns add` bind-mounts /run/netns onto itself when it is not yet a mount
// point, then makes it shared. Two processes doing that at the same moment
// stack two mounts; every name created before the second mount is hidden
// under it and can no longer be deleted (unlink answers EBUSY while its nsfs
// mount stays in the lower layer). Prepare makes the mount exactly once,
// under an flock that every process of ours takes; Create calls it first.
// Delete removes a name even when the mounts were stacked by someone else.
// Create records which process made a name (OwnerDir), and Prepare removes
// the names of processes that died before deleting them (SweepOrphans).
package netnsdir

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir is where named netns are bind-mounted (/var/run is a link to /run).
const Dir = "/run/netns"

// lockPath is the flock every process takes around making Dir a mount point.
const lockPath = "/run/netns.lock"

// Path is the netns file of name.
func Path(name string) string { return filepath.Join(Dir, name) }

var prepared sync.Once
var prepareErr error

// Prepare makes Dir a shared mount point (as `ip netns add` would) unless it
// already is one, holding an exclusive flock on /run/netns.lock so that
// concurrent processes make one mount between them, not a stack. It does the
// work once per process; later calls return the first result.
func Prepare() error {
	prepared.Do(func() { prepareErr = prepare() })
	return prepareErr
}

func prepare() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("netnsdir: %w", err)
	}
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("netnsdir: lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("netnsdir: lock %s: %w", lockPath, err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	// As iproute2: making it shared fails with EINVAL when it is not a
	// mount point yet; then bind-mount it onto itself first.
	err = unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netnsdir: bind-mount %s onto itself: %w", Dir, err)
		}
		err = unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		// Shared, so names made in one mount namespace are seen from the
		// others (a runtime's, a test's private one).
		return fmt.Errorf("netnsdir: make %s shared: %w", Dir, err)
	}
	swept, err := SweepOrphans()
	if len(swept) > 0 {
		fmt.Fprintf(os.Stderr, "netnsdir: removed %d network namespaces left by exited test processes: %s\n", len(swept), strings.Join(swept, " "))
	}
	if err != nil || !reap {
		return err
	}
	return startReaper()
}

// Mounts counts the mounts stacked on Dir in the caller's mount namespace
// (/proc/self/mountinfo): 0 before anyone prepared it, 1 as it should be,
// more after the race Prepare prevents.
func Mounts() (int, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0, fmt.Errorf("netnsdir: %w", err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Field 5 is the mount point (proc(5)).
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == Dir {
			n++
		}
	}
	return n, sc.Err()
}

// Create makes the named netns (Prepare first). The calling goroutine's
// thread never changes netns. It fails if the name exists.
func Create(name string) error {
	if err := Prepare(); err != nil {
		return err
	}
	if _, err := os.Lstat(Path(name)); err == nil {
		return fmt.Errorf("netnsdir: netns %s exists", name)
	}
	errc := make(chan error, 1)
	go func() {
		// unshare(CLONE_NEWNET) moves this thread into the new netns. The
		// thread stays locked, so it exits with the goroutine and nothing
		// else ever runs in the new netns by accident.
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		os.Remove(Path(name)) // NewNamed may leave the empty file behind
		return fmt.Errorf("netnsdir: create netns %s: %w", name, err)
	}
	if err := recordOwner(name); err != nil {
		_ = Delete(name)
		return err
	}
	return nil
}

// Delete removes the name of a netns; the kernel frees the netns once no
// process or socket holds it. A missing name is success. When the name is
// still mounted in a hidden lower layer of a stacked Dir (EBUSY), it is
// unlinked from a private mount namespace where it is no mount point: the
// kernel then detaches its mounts in every namespace.
func Delete(name string) error {
	p := Path(name)
	for {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if err != nil {
			break // EINVAL: no (more) mount here; ENOENT: no file
		}
	}
	err := unix.Unlink(p)
	switch {
	case err == nil, errors.Is(err, fs.ErrNotExist):
		forgetOwner(name)
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := unlinkPrivately(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("netnsdir: delete netns %s (hidden under stacked %s mounts): %w", name, Dir, err)
		}
		forgetOwner(name)
		return nil
	}
	return fmt.Errorf("netnsdir: delete netns %s: %w", name, err)
}

// unlinkPrivately unlinks p on a thread in a new private mount namespace
// where every mount on Dir and on p is detached, so p is a plain file there
// (unlink refuses only a mount point of the caller's own namespace). The
// thread is never unlocked: it dies with its goroutine and its namespace.
func unlinkPrivately(p string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "none", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			// Peel: the name's mounts in this layer, then the layer.
			for {
				for unix.Unmount(p, unix.MNT_DETACH) == nil {
				}
				if unix.Unmount(Dir, unix.MNT_DETACH) != nil {
					break
				}
			}
			return unix.Unlink(p)
		}()
	}()
	return <-errc
}

// DeletePrefix deletes every name in Dir that starts with prefix.
func DeletePrefix(prefix string) error {
	entries, err := os.ReadDir(Dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("netnsdir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			errs = append(errs, Delete(e.Name()))
		}
	}
	return errors.Join(errs...)
}
