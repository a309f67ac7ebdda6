// Package logfile opens the log destinations of the AWS VPC CNI's log-file
// settings (AWS_VPC_K8S_CNI_LOG_FILE for the daemon, AWS_VPC_K8S_PLUGIN_LOG_FILE
// for the plugin): a stream name or a file that is rotated by size, so a
// node's /var/log/aws-routed-eni stays bounded as the reference keeps it.
//
// Rotation is gopkg.in/natefinch/lumberjack.v2: when a write would take the
// file past MaxSizeMB it is renamed with a timestamp and a new one started;
// backups past MaxBackups or MaxAgeDays are deleted. Several processes may
// append to one file (each plugin invocation is a process): a process that
// rotates renames the file under the others, whose lines then land in the
// backup until they reopen it; no line is lost or torn (each is one write of
// an O_APPEND file).
package logfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"gopkg.in/natefinch/lumberjack.v2"
)

// Stream names a setting may hold instead of a path, as the reference
// accepts them ("stdout" for the daemon, "stderr" for the plugin; either
// here).
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Rotation bounds a log file: rotated at MaxSizeMB megabytes, at most
// MaxBackups old files kept, none older than MaxAgeDays days (0: no age
// limit).
type Rotation struct {
	MaxSizeMB  int
	MaxBackups int
	MaxAgeDays int
}

// DefaultRotation keeps at most 100 MB plus 5 backups of 100 MB, 30 days.
var DefaultRotation = Rotation{MaxSizeMB: 100, MaxBackups: 5, MaxAgeDays: 30}

// Check reports whether setting is a valid log-file setting: "" (none),
// Stdout, Stderr, or an absolute path that is not a directory name.
func Check(setting string) error {
	switch {
	case setting == "" || setting == Stdout || setting == Stderr:
		return nil
	case !filepath.IsAbs(setting):
		return fmt.Errorf("%q is neither %s, %s nor an absolute path", setting, Stdout, Stderr)
	case setting[len(setting)-1] == '/':
		return fmt.Errorf("%q names a directory, not a file", setting)
	}
	return nil
}

// Open returns the writer of setting: nil for "" (no log), os.Stdout or
// os.Stderr for the stream names (Close does not close them), else the file
// at the path, appended to and rotated by r; its directory (0755) and the
// file (0644) are created now. An invalid setting (Check) or a file that
// cannot be opened for appending is an error.
func Open(setting string, r Rotation) (io.WriteCloser, error) {
	if err := Check(setting); err != nil {
		return nil, err
	}
	switch setting {
	case "":
		return nil, nil
	case Stdout:
		return nopCloser{os.Stdout}, nil
	case Stderr:
		return nopCloser{os.Stderr}, nil
	}
	// Open (and create) the file now, so a path that cannot be written is
	// an error here, not a silently lost first write.
	if err := os.MkdirAll(filepath.Dir(setting), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(setting, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	f.Close()
	return &lumberjack.Logger{
		Filename:   setting,
		MaxSize:    r.MaxSizeMB,
		MaxBackups: r.MaxBackups,
		MaxAge:     r.MaxAgeDays,
		LocalTime:  false,
	}, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
