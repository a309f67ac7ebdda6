package netnsdir

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The tests run in a child of the test binary with a private mount
// namespace and a fresh tmpfs on /run, so /run/netns starts as on a new
// machine (absent) and the host's mounts are never touched.
const (
	envRole  = "NETNSDIR_TEST_ROLE"  // "private": the child in its own mount namespace; "create": one racer; "orphan": dies leaving a netns
	envName  = "NETNSDIR_TEST_NAME"  // the racer's netns name
	envReap  = "NETNSDIR_TEST_REAP"  // the orphan starts its reaper
	envStart = "NETNSDIR_TEST_START" // unix nanoseconds the racers start at
	// envOld makes racers create and delete as this repository did before
	// this package (netns.NewNamed, which mounts nothing on /run/netns, next
	// to `ip netns add`, which bind-mounts it onto itself when it is no mount
	// point yet; netns.DeleteNamed): set it to see the failure Prepare and
	// Delete prevent.
	envOld = "NETNSDIR_TEST_OLD"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "create":
		os.Exit(racer())
	case "orphan":
		os.Exit(orphan())
	case "private":
		// The host's mount stays listed in mountinfo while hidden under
		// the tmpfs: drop it from this namespace first.
		for unix.Unmount(Dir, unix.MNT_DETACH) == nil {
		}
		if err := unix.Mount("netnsdir-test", "/run", "tmpfs", 0, "size=1m"); err != nil {
			fmt.Fprintln(os.Stderr, "tmpfs on /run:", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// inPrivate re-runs test name in a child with its own mount namespace and
// reports its output; it returns true when the caller is that child.
func inPrivate(t *testing.T) bool {
	if os.Getenv(envRole) == "private" {
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"=private")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go makes / rprivate in the child
	out, err := cmd.CombinedOutput()
	t.Logf("private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	return false
}

// racer is one process creating its first netns at the agreed moment.
func racer() int {
	start, _ := strconv.ParseInt(os.Getenv(envStart), 10, 64)
	time.Sleep(time.Until(time.Unix(0, start)))
	name := os.Getenv(envName)
	var err error
	switch {
	case os.Getenv(envOld) != "" && strings.HasSuffix(name, "1"):
		var out []byte
		out, err = exec.Command("ip", "netns", "add", name).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
	case os.Getenv(envOld) != "":
		runtime.LockOSThread()
		var h netns.NsHandle
		if h, err = netns.NewNamed(name); err == nil {
			h.Close()
		}
	default:
		err = Create(name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Several processes creating their first netns at once on a fresh machine
// make exactly one /run/netns mount, and every name can be deleted after.
// (The old way stacks a mount over names made a moment earlier, which then
// cannot be deleted: run with NETNSDIR_TEST_OLD=1.)
func TestConcurrentFirstCreate(t *testing.T) {
	if !inPrivate(t) {
		return
	}
	if _, err := os.Stat(Dir); err == nil {
		t.Fatalf("%s exists on the fresh tmpfs", Dir)
	}
	const n = 8
	start := time.Now().Add(300 * time.Millisecond).UnixNano()
	var cmds []*exec.Cmd
	for i := range n {
		cmd := exec.Command(os.Args[0])
		name := fmt.Sprintf("vtn-race-%d%d", i, i%2)
		cmd.Env = append(os.Environ(), envRole+"=create", envName+"="+name, envStart+"="+strconv.FormatInt(start, 10))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Errorf("racer %d: %v", i, err)
		}
	}
	mounts, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	if mounts != 1 {
		t.Errorf("%s has %d stacked mounts after %d concurrent first creations, want 1", Dir, mounts, n)
	}
	for i := range n {
		name := fmt.Sprintf("vtn-race-%d%d", i, i%2)
		del := Delete
		if os.Getenv(envOld) != "" {
			del = netns.DeleteNamed
		}
		if err := del(name); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	}
	assertEmpty(t)
}

// Names hidden under a stacked /run/netns mount that another tool made are
// still deleted: one made by netns.NewNamed on the plain directory (no
// mount of its own), then `ip netns add`, which bind-mounts the directory
// onto itself and hides the first name's nsfs mount under it.
func TestDeleteUnderStackedMounts(t *testing.T) {
	if !inPrivate(t) {
		return
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread ends up in the new netns and dies with the goroutine
		h, err := netns.NewNamed("vtn-lower")
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "add", "vtn-upper").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	if n, _ := Mounts(); n != 1 {
		t.Fatalf("setup: %d mounts on %s, want 1 over the hidden name", n, Dir)
	}
	del := Delete
	if os.Getenv(envOld) != "" {
		del = netns.DeleteNamed
	}
	for _, name := range []string{"vtn-lower", "vtn-upper"} {
		if err := del(name); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	}
	assertEmpty(t)
}

// assertEmpty checks that no name file and no nsfs mount is left in Dir.
func assertEmpty(t *testing.T) {
	t.Helper()
	entries, _ := os.ReadDir(Dir)
	for _, e := range entries {
		t.Errorf("left behind: %s", Path(e.Name()))
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], Dir+"/") {
			t.Errorf("mount left behind: %s", line)
		}
	}
}

// orphan creates the netns envName, starts a process inside it and exits
// without deleting either, as a test binary killed by its timeout does. It
// prints that process's pid.
func orphan() int {
	name := os.Getenv(envName)
	reap = os.Getenv(envReap) != ""
	if err := Create(name); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command("nsenter", "--net="+Path(name), "sleep", "300")
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	return 0
}

// runOrphan runs a child that creates the netns name (starting its reaper
// when reap), starts a process inside it and exits; it returns that
// process's pid.
func runOrphan(t *testing.T, name string, reap bool) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envRole+"=orphan", envName+"="+name)
	if reap {
		cmd.Env = append(cmd.Env, envReap+"=1")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("orphan child: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("orphan child printed %q", out)
	}
	return pid
}

// A process that exits before deleting its netns (a test timeout panics
// past every t.Cleanup) leaves the name and the processes it started
// inside it; the next process's Prepare removes both. Names of running
// processes and names made by other tools stay.
func TestOrphansSwept(t *testing.T) {
	if !inPrivate(t) {
		return
	}
	pid := runOrphan(t, "vtn-orphan", false)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if _, err := os.Stat(Path("vtn-orphan")); err != nil {
		t.Fatalf("the orphan's netns is not there to sweep: %v", err)
	}
	if err := Prepare(); err != nil { // this process's first: it sweeps
		t.Fatal(err)
	}
	if _, err := os.Stat(Path("vtn-orphan")); err == nil {
		t.Error("vtn-orphan still exists after Prepare")
	}
	if _, err := os.Stat(filepath.Join(OwnerDir, "vtn-orphan")); err == nil {
		t.Error("vtn-orphan's owner record is still there")
	}
	if err := Create("vtn-alive"); err != nil { // this process: alive
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete("vtn-alive") })
	if out, err := exec.Command("ip", "netns", "add", "vtn-foreign").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { Delete("vtn-foreign") })
	swept, err := SweepOrphans()
	if err != nil || len(swept) != 0 {
		t.Errorf("second sweep: %v, %v; want nothing swept", swept, err)
	}
	for _, keep := range []string{"vtn-alive", "vtn-foreign"} {
		if _, err := os.Stat(Path(keep)); err != nil {
			t.Errorf("%s was swept: %v", keep, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			break // gone, or a zombie of its reaper
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d inside the orphan's netns still runs: %s", pid, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A process that exits before deleting its netns has its reaper delete it,
// and stop what it started inside, within seconds, whether or not another
// test process ever runs.
func TestReaperRemovesWhatAnExitedProcessLeft(t *testing.T) {
	if !inPrivate(t) {
		return
	}
	pid := runOrphan(t, "vtn-reaped", true)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL); Delete("vtn-reaped") })
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, errName := os.Stat(Path("vtn-reaped"))
		_, errRec := os.Stat(filepath.Join(OwnerDir, "vtn-reaped"))
		b, errProc := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		procGone := errProc != nil || strings.Contains(string(b), ") Z ")
		if errName != nil && errRec != nil && procGone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after its owner exited: name present %v, record present %v, process inside gone %v", errName == nil, errRec == nil, procGone)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
