package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// instructions measures (e): the user-space instructions one warm ADD and
// one DEL execute in the plugin processes, ours against the reference
// chain, counted by valgrind's cachegrind. Unlike times, the count barely
// moves when other work shares the machine, so it shows a change in the
// plugin's own cost on a noisy machine. It leaves out the kernel (netlink,
// veth creation: see the CPU time figures) and vpcipd's share.
func (b *bench) instructions(ctx context.Context) error {
	if _, err := exec.LookPath("valgrind"); err != nil {
		return errors.New("valgrind is not installed (scripts/deps.sh valgrind)")
	}
	work, err := os.MkdirTemp("", "vpcip-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// Checked first: a processor valgrind cannot run Go code on is said
	// plainly, not found as a plugin crash deep in a CNI ADD.
	if why, err := probeValgrind(ctx, work); err != nil {
		return err
	} else if why != "" {
		b.instructionsUnavailable(why)
		return nil
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix: b.prefix("bi"), Nodes: 1, InstanceType: "m5.large", BinDir: b.bin, WorkDir: work,
		DaemonEnv: []string{"WARM_IP_TARGET=4"},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	node := c.Nodes[0]
	ref, err := referenceNode(ctx, work, b.prefix("bi")+"r")
	if err != nil {
		return err
	}
	defer podruntime.CleanupNetns(ref.Netns)
	if err := waitWarm(ctx, node, 2); err != nil {
		return err
	}

	ours := *node.Runtime
	ours.Prefix = b.prefix("bi") + "cg"
	if ours.BinDir, err = cachegrindBinDir(work, "ours", node.Runtime.BinDir, "vpcip-cni"); err != nil {
		return err
	}
	theirs := *ref
	if theirs.BinDir, err = cachegrindBinDir(work, "ref", ref.BinDir, "ptp", "host-local"); err != nil {
		return err
	}
	profiles := work
	if b.profileDir != "" {
		profiles = b.profileDir
	}
	oa, od, err := countPods(ctx, &ours, filepath.Join(profiles, "vpcip"))
	if err != nil {
		if why := valgrindCannotRun(filepath.Join(profiles, "vpcip", "add")) + valgrindCannotRun(filepath.Join(profiles, "vpcip", "del")); why != "" {
			b.instructionsUnavailable(why)
			return nil
		}
		return fmt.Errorf("vpcip-cni under cachegrind: %w", err)
	}
	type counted struct {
		name     string
		add, del float64
	}
	var others []counted
	for i, o := range b.otherPlugins {
		n := *node.Runtime
		n.Prefix = fmt.Sprintf("%scg%d", b.prefix("bi"), i)
		dir := filepath.Join(work, fmt.Sprintf("plugin-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.Symlink(o.path, filepath.Join(dir, "vpcip-cni")); err != nil {
			return err
		}
		if n.BinDir, err = cachegrindBinDir(work, fmt.Sprintf("other-%d", i), dir, "vpcip-cni"); err != nil {
			return err
		}
		a, d, err := countPods(ctx, &n, filepath.Join(profiles, fmt.Sprintf("plugin-%d", i)))
		if err != nil {
			return fmt.Errorf("vpcip-cni %s (%s) under cachegrind: %w", o.name, o.path, err)
		}
		others = append(others, counted{o.name, a, d})
	}
	ra, rd, err := countPods(ctx, &theirs, filepath.Join(profiles, "reference"))
	if err != nil {
		if why := valgrindCannotRun(filepath.Join(profiles, "reference", "add")) + valgrindCannotRun(filepath.Join(profiles, "reference", "del")); why != "" {
			b.instructionsUnavailable(why)
			return nil
		}
		return fmt.Errorf("reference chain under cachegrind: %w", err)
	}
	b.add(Figure{Name: "(e) instructions per ADD (user space)", Value: oa / 1e6, Ref: ra / 1e6, Unit: "M"})
	b.add(Figure{Name: "(e) instructions per DEL (user space)", Value: od / 1e6, Ref: rd / 1e6, Unit: "M"})
	for _, o := range others {
		b.add(Figure{Name: "(e) instructions per ADD, " + o.name, Value: o.add / 1e6, Ref: ra / 1e6, Unit: "M",
			Note: fmt.Sprintf("ours ÷ this %.3f×", oa/o.add)})
		b.add(Figure{Name: "(e) instructions per DEL, " + o.name, Value: o.del / 1e6, Ref: rd / 1e6, Unit: "M",
			Note: fmt.Sprintf("ours ÷ this %.3f×", od/o.del)})
	}
	return nil
}

// namedPlugin is a vpcip-cni binary (e) counts beside ours
// (--cachegrind-plugin NAME=PATH).
type namedPlugin struct{ name, path string }

// pluginFlag collects --cachegrind-plugin values.
type pluginFlag []namedPlugin

func (f *pluginFlag) String() string { return fmt.Sprint(*f) }

// Set parses NAME=PATH; PATH must be an executable file.
func (f *pluginFlag) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want NAME=PATH, got %q", v)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if st, err := os.Stat(abs); err != nil {
		return err
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", abs)
	}
	*f = append(*f, namedPlugin{name, abs})
	return nil
}

// instructionsUnavailable records (e) as not measurable on this machine,
// with valgrind's reason.
func (b *bench) instructionsUnavailable(why string) {
	note := UnavailablePrefix + "valgrind cannot run Go code on this processor: " + why
	fmt.Println("   (e) " + note)
	b.add(Figure{Name: "(e) instructions per ADD (user space)", Unit: "M", Note: note})
	b.add(Figure{Name: "(e) instructions per DEL (user space)", Unit: "M", Note: note})
}

// UnavailablePrefix starts the Note of a figure this machine cannot
// measure; the figure's Value is then 0.
const UnavailablePrefix = "unavailable: "

// cachegrindGODEBUG is the Go runtime settings every plugin runs with under
// valgrind, ours and the reference's alike:
//   - asyncpreemptoff=1: valgrind's tools mishandle the runtime's
//     preemption signals, and a process of a few milliseconds does not
//     need them;
//   - cpu.rdtscp=off: on some processors (AMD EPYC here) valgrind 3.19's
//     CPUID reports RDTSCP but its decoder does not handle the instruction
//     ("vex amd64->IR: unhandled instruction bytes: 0xF 0x1 0xF9"), so a
//     Go process that waits on a contended runtime lock (which reads the
//     cycle counter with RDTSCP) dies of SIGILL, and the runtime, printing
//     that, reads it again ("panic during panic"). Off, the runtime reads it
//     with LFENCE+RDTSC, which valgrind decodes everywhere; the count moves
//     by one instruction per read.
const cachegrindGODEBUG = "asyncpreemptoff=1,cpu.rdtscp=off"

// cachegrindBinDir makes a CNI bin dir under work whose first plugin runs
// under cachegrind (following the plugins it executes, as ptp does
// host-local) and whose others are links to the real binaries in from.
// Profiles and valgrind's logs are written to $VPCIP_CACHEGRIND_DIR.
// (callgrind, which would give call graphs, aborts on the SIGCHLD ptp gets
// from host-local.)
func cachegrindBinDir(work, name, from string, plugins ...string) (string, error) {
	dir := filepath.Join(work, "cg-bin-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	script := fmt.Sprintf(`#!/bin/sh
export GODEBUG=%s
exec valgrind --tool=cachegrind --cache-sim=no --trace-children=yes --log-file="$VPCIP_CACHEGRIND_DIR/log.%%p" \
	--cachegrind-out-file="$VPCIP_CACHEGRIND_DIR/cachegrind.%%p" %q "$@"
`, cachegrindGODEBUG, filepath.Join(from, plugins[0]))
	if err := os.WriteFile(filepath.Join(dir, plugins[0]), []byte(script), 0o755); err != nil {
		return "", err
	}
	for _, p := range plugins[1:] {
		if err := os.Symlink(filepath.Join(from, p), filepath.Join(dir, p)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// cachegrindPods is how many pods (e) starts and stops per chain; the
// count of one ADD varies by about 1% with goroutine scheduling.
const cachegrindPods = 3

// countPods runs cachegrindPods pods' ADD and DEL, one after the other,
// through n (a cachegrind bin dir) and returns the instructions per ADD
// and per DEL, summed over every process the chain ran.
func countPods(ctx context.Context, n *podruntime.Node, dir string) (add, del float64, err error) {
	defer os.Unsetenv("VPCIP_CACHEGRIND_DIR")
	addDir, delDir := filepath.Join(dir, "add"), filepath.Join(dir, "del")
	for _, d := range []string{addDir, delDir} {
		if err := os.RemoveAll(d); err != nil {
			return 0, 0, err
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 0, 0, err
		}
	}
	for i := range cachegrindPods {
		os.Setenv("VPCIP_CACHEGRIND_DIR", addDir)
		p, err := n.Add(ctx, podruntime.PodSpec{Namespace: "bench", Name: fmt.Sprintf("cachegrind-%d", i)})
		if err != nil {
			return 0, 0, err
		}
		os.Setenv("VPCIP_CACHEGRIND_DIR", delDir)
		if err := n.Del(ctx, p); err != nil {
			return 0, 0, err
		}
	}
	if add, err = sumInstructions(addDir); err != nil {
		return 0, 0, err
	}
	del, err = sumInstructions(delDir)
	return add / cachegrindPods, del / cachegrindPods, err
}

// sumInstructions adds the "summary:" (instructions executed) of every
// cachegrind profile in dir.
func sumInstructions(dir string) (float64, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "cachegrind.*"))
	if len(files) == 0 {
		logs, _ := filepath.Glob(filepath.Join(dir, "log.*"))
		var tail []byte
		if len(logs) > 0 {
			tail, _ = os.ReadFile(logs[0])
		}
		return 0, fmt.Errorf("cachegrind wrote no profile in %s: %.600s", dir, tail)
	}
	var total float64
	for _, f := range files {
		n, err := summary(f)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func summary(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary:"); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("%s: no summary line (cachegrind died?)", path)
}
