package kubetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestRemoveStale: a server directory whose owner process is gone (a test
// binary killed with SIGKILL) is removed at the next start; one whose owner
// runs, one without an owner file and one with an unreadable owner stay,
// as does anything not named kubetest-*.
func TestRemoveStale(t *testing.T) {
	base := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{ // directory → owner file content ("" none)
		"kubetest-dead-1": strconv.Itoa(gone.Process.Pid),
		"kubetest-live-2": strconv.Itoa(os.Getpid()),
		"kubetest-old-3":  "",
		"kubetest-bad-4":  "not a pid",
		"other-dead-5":    strconv.Itoa(gone.Process.Pid),
	}
	for d, owner := range dirs {
		if err := os.MkdirAll(filepath.Join(base, d, "etcd"), 0o700); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(base, d, ownerFile), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	removeStale(base)
	for d := range dirs {
		_, err := os.Stat(filepath.Join(base, d))
		if gotGone, wantGone := os.IsNotExist(err), d == "kubetest-dead-1"; gotGone != wantGone {
			t.Errorf("%s: removed %v, want %v", d, gotGone, wantGone)
		}
	}
}
