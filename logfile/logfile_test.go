package logfile

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		setting string
		ok      bool
	}{
		{"", true},
		{"stdout", true},
		{"stderr", true},
		{"/host/var/log/aws-routed-eni/ipamd.log", true},
		{"var/log/ipamd.log", false},
		{"/var/log/aws-routed-eni/", false},
		{"STDOUT", false},
	}
	for _, tt := range tests {
		if err := Check(tt.setting); (err == nil) != tt.ok {
			t.Errorf("Check(%q) = %v, want ok %v", tt.setting, err, tt.ok)
		}
	}
}

func TestOpenStreamsAndNone(t *testing.T) {
	if w, err := Open("", DefaultRotation); w != nil || err != nil {
		t.Errorf("Open(\"\") = %v, %v; want nil, nil", w, err)
	}
	w, err := Open("stderr", DefaultRotation)
	if err != nil || w.(nopCloser).Writer != os.Stderr {
		t.Errorf("Open(stderr) = %v, %v", w, err)
	}
	w.Close()
	if _, err := os.Stderr.Stat(); err != nil {
		t.Errorf("Close of the stderr writer closed stderr: %v", err)
	}
	if _, err := Open("relative.log", DefaultRotation); err == nil {
		t.Error("Open(relative.log) succeeded")
	}
	blocker := filepath.Join(t.TempDir(), "file")
	os.WriteFile(blocker, nil, 0o644)
	if _, err := Open(filepath.Join(blocker, "ipamd.log"), DefaultRotation); err == nil {
		t.Error("Open under a regular file succeeded; want the error now, not at the first write")
	}
}

// A file setting creates its directory, appends every line, and rotates past
// the size limit keeping at most MaxBackups old files.
func TestOpenRotates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "aws-routed-eni")
	path := filepath.Join(dir, "ipamd.log")
	w, err := Open(path, Rotation{MaxSizeMB: 1, MaxBackups: 2})
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 1023) + "\n") // 1 KiB
	const lines = 4 * 1024                           // 4 MiB: at least 3 rotations at 1 MB
	for i := range lines {
		if _, err := w.Write(line); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the log file: %v", err)
	}
	if len(cur) == 0 || len(cur) > 1024*1024 || !bytes.HasSuffix(cur, line) {
		t.Errorf("current file %d bytes, want 1..1 MiB ending in a whole line", len(cur))
	}
	// Backups are removed by a background goroutine after rotation: wait
	// for the count to settle (bounded).
	var backups []string
	for range 200 {
		entries, _ := os.ReadDir(dir)
		backups = backups[:0]
		for _, e := range entries {
			if e.Name() != "ipamd.log" {
				backups = append(backups, e.Name())
			}
		}
		if len(backups) <= 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(backups) == 0 || len(backups) > 2 {
		t.Errorf("backups %v, want 1..2 (MaxBackups 2)", backups)
	}
	for _, b := range backups {
		if !strings.HasPrefix(b, "ipamd-") || !strings.HasSuffix(b, ".log") {
			t.Errorf("backup name %q, want ipamd-<time>.log", b)
		}
	}
}
