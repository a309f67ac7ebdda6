package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// hostRoot is the machine's own Debian root: scripts/deps.sh installs
// iptables, so the layer can be taken from it without fetching packages.
const hostRoot = "/"

func needIptables(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/xtables-nft-multi"); err != nil {
		t.Skip("iptables is not installed (scripts/deps.sh installs it)")
	}
}

// The iptables layer runs on its own: materialized in an empty directory and
// entered with chroot, both backends answer, so every library and the loader
// came along.
func TestIptablesLayerRunsInAnEmptyRoot(t *testing.T) {
	needIptables(t)
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	files, err := iptablesLayer(hostRoot, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if f.Link != "" {
			err = os.Symlink(f.Link, p)
		} else {
			err = os.WriteFile(p, f.Data, os.FileMode(f.Mode))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for cmd, want := range map[string]string{
		"/usr/sbin/iptables":                      "nf_tables",
		"/usr/sbin/iptables-save":                 "nf_tables",
		"/usr/lib/vpcip/iptables-legacy/iptables": "legacy",
	} {
		out, err := exec.Command("chroot", dir, cmd, "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("chroot %s --version: %v %s; want %s", cmd, err, out, want)
		}
	}
	var size int
	for _, f := range files {
		size += len(f.Data)
	}
	t.Logf("iptables layer: %d files, %d bytes uncompressed", len(files), size)
}

// Same binaries and packages give the same archive, byte for byte.
func TestImageIsReproducible(t *testing.T) {
	needIptables(t)
	bin := t.TempDir()
	for i, b := range binaries {
		if err := os.WriteFile(filepath.Join(bin, b), bytes.Repeat([]byte{byte(i)}, 1000), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func() ([]byte, string) {
		img, err := image(bin, hostRoot, "localhost/vpcip/vpcip:t", runtime.GOARCH)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		desc, err := ociarchive.Write(&buf, img)
		if err != nil {
			t.Fatal(err)
		}
		return buf.Bytes(), desc.Digest.String()
	}
	a, da := write()
	b, db := write()
	if da != db || !bytes.Equal(a, b) {
		t.Fatalf("two builds differ: %s vs %s", da, db)
	}
	os.WriteFile(filepath.Join(bin, "vpcipd"), []byte("changed"), 0o755)
	if _, dc := write(); dc == da {
		t.Error("a changed binary kept the digest")
	}
}

func TestRunNeedsItsFlags(t *testing.T) {
	if err := run("", "/", "x.tar", "a:b", runtime.GOARCH); err == nil {
		t.Error("run without -bin succeeded")
	}
	if _, err := iptablesLayer(t.TempDir(), runtime.GOARCH); err == nil {
		t.Error("an empty root gave an iptables layer")
	}
	if _, err := libDirsFor("mips"); err == nil {
		t.Error("unknown GOARCH accepted")
	}
}
