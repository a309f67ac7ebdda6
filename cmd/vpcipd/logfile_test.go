package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestLogFileAsWellAsStderr: with AWS_VPC_K8S_CNI_LOG_FILE set to a path (the
// AWS VPC CNI's /host/var/log/aws-routed-eni/ipamd.log, here under a temp
// dir) vpcipd writes every log line to stderr and also to that file, whose
// directory it creates; a path it cannot write stops it naming the variable.
func TestLogFileAsWellAsStderr(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 26})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	logFile := filepath.Join(dir, "host", "var", "log", "aws-routed-eni", "ipamd.log")
	env := append(daemonEnv(l, inst.ID, dir), "AWS_VPC_K8S_CNI_LOG_FILE="+logFile)
	p := startDaemon(t, bin, env, dir)
	p.cmd.Process.Kill()
	p.cmd.Wait()

	stderr, err := os.ReadFile(filepath.Join(dir, "vpcipd.log"))
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatalf("the log file: %v\nstderr:\n%s", err, stderr)
	}
	if len(file) == 0 || !bytes.HasPrefix(stderr, file[:bytes.IndexByte(file, '\n')+1]) {
		t.Errorf("the log file does not start with stderr's first line:\nfile:\n%.400s\nstderr:\n%.400s", file, stderr)
	}
	if n, m := bytes.Count(file, []byte("\n")), bytes.Count(stderr, []byte("\n")); n < 2 || n != m {
		t.Errorf("the log file has %d lines, stderr %d; want the same, at least 2", n, m)
	}

	blocker := filepath.Join(dir, "not-a-dir")
	os.WriteFile(blocker, nil, 0o644)
	cmd := exec.Command(bin)
	cmd.Env = append(daemonEnv(l, inst.ID, dir), "AWS_VPC_K8S_CNI_LOG_FILE="+filepath.Join(blocker, "ipamd.log"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "AWS_VPC_K8S_CNI_LOG_FILE") {
		t.Errorf("an unwritable log file: %v, want exit 2 naming AWS_VPC_K8S_CNI_LOG_FILE\n%s", err, out)
	}
}
