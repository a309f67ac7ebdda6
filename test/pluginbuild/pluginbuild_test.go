package pluginbuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginBuildsCarryTags pins that every build of the plugin uses the
// tags of TagsFile, so the builds cannot drift: the binary Build makes
// (what the test harnesses run) records them, every `go build` of
// cmd/vpcip-cni that `make build image` would run passes them, and the
// plugin binaries the Makefile already built (newer than TagsFile) record
// them.
func TestPluginBuildsCarryTags(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	tags, err := Tags(root)
	if err != nil {
		t.Fatal(err)
	}
	// docs/design.md §3: net/http without its bundled HTTP/2, which a unix
	// socket to vpcipd never uses.
	if !strings.Contains(","+tags+",", ",nethttpomithttp2,") {
		t.Fatalf("%s = %q, want it to name nethttpomithttp2", TagsFile, tags)
	}

	bin := filepath.Join(t.TempDir(), "vpcip-cni")
	if err := Build(root, bin); err != nil {
		t.Fatal(err)
	}
	if got, err := BinaryTags(bin); err != nil || got != tags {
		t.Errorf("plugin built by pluginbuild.Build records tags %q (%v), want %q", got, err, tags)
	}

	cmd := exec.Command("make", "-n", "--no-print-directory", "build", "image")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build image: %v\n%s", err, out)
	}
	builds := 0
	for _, line := range strings.Split(strings.ReplaceAll(string(out), "\\\n", " "), "\n") {
		if !strings.Contains(line, " build ") || !strings.Contains(line, "cmd/vpcip-cni") {
			continue
		}
		builds++
		if !strings.Contains(line, "-tags="+tags+" ") && !strings.Contains(line, "-tags '"+tags+"'") {
			t.Errorf("the Makefile builds the plugin without -tags=%s:\n%s", tags, line)
		}
	}
	if builds < 2 {
		t.Errorf("make -n build image printed %d builds of cmd/vpcip-cni, want the plugin's (build) and the image's:\n%s", builds, out)
	}

	tf, err := os.Stat(filepath.Join(root, TagsFile))
	if err != nil {
		t.Fatal(err)
	}
	built, _ := filepath.Glob(filepath.Join(root, "bin", "image", "linux_*", "vpcip-cni"))
	for _, p := range append(built, filepath.Join(root, "bin", "vpcip-cni")) {
		if st, err := os.Stat(p); err != nil || st.ModTime().Before(tf.ModTime()) {
			continue // not built, or built before the tags changed
		}
		if got, err := BinaryTags(p); err != nil || got != tags {
			t.Errorf("%s records tags %q (%v), want %q", p, got, err, tags)
		}
	}
}
