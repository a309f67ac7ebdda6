package main

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// needValgrind skips without valgrind, or fails with VPCIP_REQUIRE_VALGRIND=1
// (make test installs it).
func needValgrind(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("valgrind"); err != nil {
		if os.Getenv("VPCIP_REQUIRE_VALGRIND") == "1" {
			t.Fatal("valgrind is not installed (scripts/deps.sh valgrind)")
		}
		t.Skip("valgrind is not installed")
	}
}

// TestValgrindRunsGoCode: cachegrind, as (e) runs the plugins, runs a Go
// program that contends for runtime locks and reads the cycle counter. On a
// processor where valgrind 3.19 advertises but cannot decode RDTSCP (AMD
// EPYC), this failed with SIGILL ("panic during panic") until the plugins
// ran with cpu.rdtscp=off.
func TestValgrindRunsGoCode(t *testing.T) {
	needValgrind(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	why, err := probeValgrind(ctx, t.TempDir())
	if err != nil || why != "" {
		t.Fatalf("cgprobe under cachegrind: unavailable %q, error %v", why, err)
	}
}

// TestValgrindUnavailableOnlyForItsOwnLimit: (e) may report "unavailable"
// only when valgrind itself cannot decode an instruction; a program that
// panics under cachegrind for a reason of its own is a failure.
func TestValgrindUnavailableOnlyForItsOwnLimit(t *testing.T) {
	needValgrind(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	why, err := probeValgrind(ctx, t.TempDir(), "-panic")
	if err == nil || why != "" {
		t.Errorf("a panicking program: unavailable %q, error %v; want an error and no unavailability", why, err)
	} else if !strings.Contains(err.Error(), "a failure of the program's own") {
		t.Errorf("error %v does not carry the program's panic", err)
	}
	if runtime.GOARCH != "amd64" {
		return // the undecodable instruction is an amd64 one
	}
	why, err = probeValgrind(ctx, t.TempDir(), "-illegal")
	if err != nil || !strings.Contains(why, unrecognised) || !strings.Contains(why, "unhandled instruction bytes: 0x62 0xF1") {
		t.Errorf("an instruction valgrind cannot decode: unavailable %q, error %v; want valgrind's message", why, err)
	}
}
