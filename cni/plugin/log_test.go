package plugin

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The plugin's log goes to pluginLogFile (the AWS VPC CNI's
// AWS_VPC_K8S_PLUGIN_LOG_FILE, e.g. /var/log/aws-routed-eni/plugin.log),
// creating its directory and appending across invocations; "stderr" writes
// no file.
func TestOpenLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "aws-routed-eni", "plugin.log")
	for i := range 2 {
		log, closeLog := openLog(&Config{PluginLogFile: path, LogLevel: slog.LevelInfo})
		log.Info("added", "call", i)
		log.Debug("not at info")
		closeLog()
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(got), "\n"); lines != 2 || !strings.Contains(string(got), `"call":1`) {
		t.Errorf("plugin log:\n%s\nwant 2 info lines, one per invocation", got)
	}

	stderrOnly := "stderr" // a file setting would be relative to the working directory
	t.Cleanup(func() { os.Remove(stderrOnly) })
	log, closeLog := openLog(&Config{PluginLogFile: "stderr", LogLevel: slog.LevelError})
	log.Info("dropped")
	closeLog()
	if _, err := os.Stat(stderrOnly); !os.IsNotExist(err) {
		t.Errorf("pluginLogFile stderr made a file: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files in %s: %v, want only aws-routed-eni", dir, entries)
	}
}
