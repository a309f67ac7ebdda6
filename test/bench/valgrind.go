package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// unrecognised is how valgrind says a process reached an instruction its
// decoder does not handle; it then raises SIGILL in the process.
const unrecognised = "valgrind: Unrecognised instruction"

// valgrindCannotRun reads valgrind's logs (log.<pid>) in dir and returns
// valgrind's own words when a process died on an instruction valgrind
// cannot decode, "" otherwise: a plugin that fails under cachegrind for any
// other reason (a panic of its own, an error) is the plugin's failure, not
// valgrind's limit, and the bench must fail on it.
func valgrindCannotRun(dir string) string {
	logs, _ := filepath.Glob(filepath.Join(dir, "log.*"))
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			continue
		}
		var lines []string
		found := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			t := sc.Text()
			switch {
			case strings.Contains(t, "unhandled instruction bytes"):
				lines = append(lines, strings.TrimSpace(t))
			case strings.Contains(t, unrecognised):
				found = true
				lines = append(lines, strings.TrimSpace(t[strings.Index(t, "valgrind:"):]))
			case found && strings.Contains(t, " at 0x") && len(lines) < 4:
				lines = append(lines, strings.TrimSpace(t[strings.Index(t, "at 0x"):]))
			}
		}
		f.Close()
		if found {
			return strings.Join(lines, "; ")
		}
	}
	return ""
}

// probeValgrind runs cgprobe (a Go program exercising what makes a plugin's
// runtime differ from a trivial binary's: locked threads, contended locks,
// cycle-counter reads) under cachegrind exactly as (e) runs the plugins. It
// returns "" when cachegrind runs it, valgrind's reason when valgrind cannot
// (see valgrindCannotRun), and an error for any other failure.
func probeValgrind(ctx context.Context, work string, args ...string) (string, error) {
	bin := filepath.Join(work, "cgprobe-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, "cgprobe"), "github.com/vpcip/vpcip/test/bench/cgprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build cgprobe: %v: %s", err, out)
	}
	dir, err := cachegrindBinDir(work, "probe", bin, "cgprobe")
	if err != nil {
		return "", err
	}
	logs := filepath.Join(work, "cgprobe-logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "cgprobe"), args...)
	cmd.Env = append(os.Environ(), "VPCIP_CACHEGRIND_DIR="+logs)
	out, runErr := cmd.CombinedOutput()
	if why := valgrindCannotRun(logs); why != "" {
		return why, nil
	}
	if runErr != nil {
		return "", fmt.Errorf("cgprobe under cachegrind: %v: %.600s", runErr, out)
	}
	if _, err := sumInstructions(logs); err != nil {
		return "", err
	}
	return "", nil
}
