package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
)

// Writer identifies the daemon that wrote a checkpoint: its program, its
// build (module version and VCS revision when the binary records them, else
// the first 12 hex digits of the executable's SHA-256) and process.
type Writer struct {
	Program string `json:"program,omitempty"`
	Build   string `json:"build,omitempty"`
	PID     int    `json:"pid,omitempty"`
}

var (
	selfOnce sync.Once
	self     Writer
)

// Self is this process as a Writer, computed once.
func Self() Writer {
	selfOnce.Do(func() {
		self = Writer{Program: filepath.Base(os.Args[0]), Build: build(), PID: os.Getpid()}
	})
	return self
}

func build() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return bi.Main.Version + " " + s.Value
			}
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	f, err := os.Open(exe)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:12]
}
