// Package pluginbuild builds cmd/vpcip-cni for tests and benchmarks as the
// Makefile builds it: static (CGO_ENABLED=0), stripped, and with the build
// tags named in cmd/vpcip-cni/build-tags, the one list every build of the
// plugin reads (docs/design.md §3, "The plugin's socket client").
package pluginbuild

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// TagsFile is where a source tree of the module names the plugin's build
// tags, relative to the tree's root: one line, comma-separated. The
// Makefile reads it too.
const TagsFile = "cmd/vpcip-cni/build-tags"

// Env is the environment the plugin is built with, added to the process's:
// no cgo, so the binary is static and skips the dynamic loader at every
// start.
var Env = []string{"CGO_ENABLED=0"}

// Root returns the directory of the module's source tree the go command
// sees from the working directory. Errors: the go command's.
func Root() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Tags returns the build tags of the source tree at root ("" when the tree
// has no TagsFile: a revision from before it). Errors: reading the file.
func Tags(root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, TagsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// Args returns the arguments after "go" that build the plugin of the
// source tree at root into out (a file, or a directory ending in "/"); run
// them in root with Env.
func Args(root, out string) ([]string, error) {
	tags, err := Tags(root)
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-ldflags=-s -w"}
	if tags != "" {
		args = append(args, "-tags="+tags)
	}
	return append(args, "-o", out, "./cmd/vpcip-cni"), nil
}

// Build builds the plugin of the source tree at root into out (see Args).
// Errors carry the go command's output.
func Build(root, out string) error {
	args, err := Args(root, out)
	if err != nil {
		return err
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build cmd/vpcip-cni in %s: %v\n%s", root, err, out)
	}
	return nil
}

// BinaryTags returns the build tags recorded in the Go binary at path (go
// version -m, "-tags" of its build settings; "" for none). Errors: the go
// command's (not a Go binary, no build information).
func BinaryTags(path string) (string, error) {
	out, err := exec.Command("go", "version", "-m", path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go version -m %s: %v: %s", path, err, bytes.TrimSpace(out))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "-tags=") {
			return strings.TrimPrefix(f[1], "-tags="), nil
		}
	}
	return "", nil
}
