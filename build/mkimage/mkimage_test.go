package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
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

// tinyELF returns an ELF header for machine m and nothing else: enough for
// the image's architecture check, small enough to compress in no time.
func tinyELF(m elf.Machine) []byte {
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(m), Version: uint32(elf.EV_CURRENT), Ehsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var buf bytes.Buffer
	binary.Write(&buf, binary.LittleEndian, h)
	return buf.Bytes()
}

// hostBinaries writes an ELF header for the host's architecture as each image
// binary into bin/linux_GOARCH, and returns bin.
func hostBinaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	dir := filepath.Join(bin, "linux_"+runtime.GOARCH)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(dir, b), tinyELF(elfMachine[runtime.GOARCH]), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// Same binaries and packages give the same archive, byte for byte.
func TestImageIsReproducible(t *testing.T) {
	needIptables(t)
	bin := hostBinaries(t)
	roots := rootFlag{runtime.GOARCH: hostRoot}
	out := t.TempDir()
	write := func(name string) []byte {
		if err := run(bin, roots, filepath.Join(out, name), "localhost/vpcip/vpcip:t"); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	a, b := write("a.tar"), write("b.tar")
	if !bytes.Equal(a, b) {
		t.Fatal("two builds differ")
	}
	changed := append(tinyELF(elfMachine[runtime.GOARCH]), "changed"...)
	if err := os.WriteFile(filepath.Join(bin, "linux_"+runtime.GOARCH, "vpcipd"), changed, 0o755); err != nil {
		t.Fatal(err)
	}
	if c := write("c.tar"); bytes.Equal(a, c) {
		t.Error("a changed binary kept the archive")
	}
}

func TestRunNeedsItsFlags(t *testing.T) {
	if err := run("", rootFlag{runtime.GOARCH: "/"}, "x.tar", "a:b"); err == nil {
		t.Error("run without -bin succeeded")
	}
	if err := run(t.TempDir(), rootFlag{}, "x.tar", "a:b"); err == nil {
		t.Error("run without -root succeeded")
	}
	if _, err := iptablesLayer(t.TempDir(), runtime.GOARCH); err == nil {
		t.Error("an empty root gave an iptables layer")
	}
	if _, err := libDirsFor("mips"); err == nil {
		t.Error("unknown GOARCH accepted")
	}
}

// -root takes ARCH=DIR once per known architecture; an empty directory (a
// failed scripts/image-root.sh in the Makefile) is refused.
func TestRootFlag(t *testing.T) {
	r := rootFlag{}
	if err := r.Set("arm64=/b"); err != nil {
		t.Fatal(err)
	}
	if err := r.Set("amd64=/a"); err != nil {
		t.Fatal(err)
	}
	if got, want := r.String(), "amd64=/a,arm64=/b"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, bad := range []string{"arm64=", "=/x", "/x", "mips=/x", "amd64=/again"} {
		if err := r.Set(bad); err == nil {
			t.Errorf("-root %s accepted", bad)
		}
	}
}

// A binary or a Debian root of another architecture than the manifest's is
// refused when the image is built, naming the file.
func TestImageRefusesAnotherArchitecture(t *testing.T) {
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	exe, _ := os.Executable()
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkELF("vpcipd", data, runtime.GOARCH); err != nil {
		t.Errorf("the test's own executable refused for %s: %v", runtime.GOARCH, err)
	}
	if err := checkELF("vpcipd", data, other); err == nil || !strings.Contains(err.Error(), "vpcipd is for") {
		t.Errorf("a %s executable for the %s image: %v, want a refusal", runtime.GOARCH, other, err)
	}
	if err := checkELF("vpcipd", tinyELF(elfMachine[other]), other); err != nil {
		t.Errorf("an ELF file for %s refused for %s: %v", other, other, err)
	}
	if err := checkELF("vpcipd", []byte("#!/bin/sh\n"), runtime.GOARCH); err == nil {
		t.Error("a script accepted as a binary")
	}
	needIptables(t)
	if _, err := iptablesLayer(hostRoot, other); err == nil || !strings.Contains(err.Error(), "xtables") {
		t.Errorf("the host's iptables taken for %s: %v, want a refusal naming it", other, err)
	}
}
