package netnsdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// OwnerDir holds one record per name Create made: a file of that name
// holding "<pid> <start time>" of the process that made it (the start time
// in clock ticks since boot, proc(5) stat field 22, so a reused pid is not
// mistaken for the owner). Delete removes the record. A test process killed
// before its cleanup ran (a test timeout panics past every t.Cleanup; a
// SIGKILL) leaves names, and the processes it started inside them, behind:
// SweepOrphans, which Prepare runs once per process, removes both, and so
// does the reaper Prepare starts: a detached shell that waits for this
// process to exit and then removes what it left (startReaper).
const OwnerDir = "/run/vpcip-netns-owners"

// reaperScript runs detached with $1 = the watched pid and $2 = its start
// time: once that process is gone it kills what runs in the namespaces
// recorded as its own and deletes them with their records. A process that
// cleaned up after itself leaves no record, so the reaper has nothing to do.
const reaperScript = `
while [ "$(cut -d')' -f2- /proc/$1/stat 2>/dev/null | awk '{print $20}')" = "$2" ]; do sleep 1; done
for f in ` + OwnerDir + `/*; do
	[ -f "$f" ] || continue
	read -r pid start < "$f" || continue
	[ "$pid" = "$1" ] && [ "$start" = "$2" ] || continue
	name=$(basename "$f")
	for p in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$p"; done
	ip netns del "$name" 2>/dev/null
	rm -f "$f"
done
`

// startReaper starts the reaper of this process (reaperScript), in its own
// session so that it outlives this process and its process group.
func startReaper() error {
	line, err := self()
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "netnsdir-reaper", f[0], f[1])
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("netnsdir: start reaper: %w", err)
	}
	go cmd.Wait() // the reaper outlives us in the usual case; then init reaps it
	return nil
}

// reap is whether Prepare starts the reaper (tests of SweepOrphans alone
// turn it off in their child).
var reap = true

// self is this process's record line.
func self() (string, error) {
	start, err := startTime(os.Getpid())
	if err != nil {
		return "", err
	}
	return strconv.Itoa(os.Getpid()) + " " + start, nil
}

// startTime is field 22 of /proc/<pid>/stat. Errors: no such process.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command (field 2) is in parentheses and may hold spaces: count
	// fields after its closing one (field 3 is the first after it).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("netnsdir: /proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("netnsdir: /proc/%d/stat: %d fields after the command", pid, len(f))
	}
	return f[19], nil
}

func recordOwner(name string) error {
	line, err := self()
	if err != nil {
		return fmt.Errorf("netnsdir: owner of %s: %w", name, err)
	}
	if err := os.MkdirAll(OwnerDir, 0o755); err != nil {
		return fmt.Errorf("netnsdir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(OwnerDir, name), []byte(line+"\n"), 0o644); err != nil {
		return fmt.Errorf("netnsdir: owner of %s: %w", name, err)
	}
	return nil
}

func forgetOwner(name string) { os.Remove(filepath.Join(OwnerDir, name)) }

// ownerAlive reports whether the record's process still runs (same pid,
// same start time). A record it cannot parse counts as alive: only a record
// shown stale is acted on.
func ownerAlive(record string) bool {
	f := strings.Fields(record)
	if len(f) != 2 {
		return true
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return true
	}
	start, err := startTime(pid)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	return err != nil || start == f[1]
}

// SweepOrphans deletes the names whose recorded owner has exited, after
// killing (SIGKILL) every process still inside them, and returns the names
// it deleted. Names made by running processes, and names without a record
// (made by other tools: `ip netns add`, a container runtime), are left alone.
func SweepOrphans() ([]string, error) {
	entries, err := os.ReadDir(OwnerDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netnsdir: %w", err)
	}
	var swept []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		b, err := os.ReadFile(filepath.Join(OwnerDir, name))
		if err != nil || ownerAlive(string(b)) {
			continue
		}
		killInside(Path(name))
		if err := Delete(name); err != nil {
			errs = append(errs, err)
			continue
		}
		swept = append(swept, name)
	}
	return swept, errors.Join(errs...)
}

// killInside sends SIGKILL to every process whose network namespace is the
// one bound at path, and waits briefly for them to go.
func killInside(path string) {
	var ns unix.Stat_t
	if err := unix.Stat(path, &ns); err != nil {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || st.Dev != ns.Dev || st.Ino != ns.Ino {
			continue
		}
		pid, err := strconv.Atoi(strings.Split(p, "/")[2])
		if err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
