// Command mkimage builds vpcip's container image as an OCI archive that
// `ctr -n k8s.io images import` loads, without Docker or a registry.
//
//	mkimage -bin bin/image \
//	        -root amd64=/var/cache/vpcip/image-root/<key>/root \
//	        -root arm64=/var/cache/vpcip/image-root/<key>/root \
//	        -o bin/vpcip-image.tar [-name localhost/vpcip/vpcip:0.1.0]
//
// The image is multi-architecture: one -root ARCH=DIR per GOARCH (amd64,
// arm64), each an unpacked Debian root of that architecture (see
// scripts/image-root.sh), with that architecture's binaries in
// -bin/linux_ARCH/. The archive's index.json names one OCI image index that
// lists a linux/ARCH manifest per -root, sorted by architecture; containerd
// and registries pick the node's own. Each ELF file taken (binaries,
// iptables, libraries) must be for its manifest's architecture.
//
// Each manifest has two layers, bottom first:
//
//  1. iptables userland from Debian packages unpacked under -root (see
//     scripts/image-root.sh): xtables-nft-multi and xtables-legacy-multi, the
//     xtables extension modules, the libraries they need (followed through
//     ELF DT_NEEDED, so nothing else of the packages is taken) and
//     /etc/protocols. vpcipd programs SNAT through go-iptables, which execs
//     `iptables`, `iptables-save` and `iptables-restore` from PATH: they
//     point at the nf_tables backend (Debian 12's and Amazon Linux 2023's);
//     /usr/lib/vpcip/iptables-legacy holds the same names for the legacy
//     backend, for hosts that still use it (prepend it to PATH).
//  2. vpcipd, vpcip-cni, vpcipctl and the reference host-local IPAM plugin
//     (containernetworking/plugins, which IPv6 pods' IPv4 egress delegates
//     to) from -bin (static, CGO_ENABLED=0) in /usr/local/bin; vpcipd is
//     the entrypoint, and `vpcipd install-cni` copies vpcip-cni (and, in
//     IPv6 mode, host-local) from beside itself.
//
// The output is reproducible: the same binaries and packages give the same
// bytes and digest. It prints the archive's path, the reference, the image
// index's digest (the image's digest once pushed) and the archive's size in
// bytes.
package main

import (
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// binaries are the programs of the image's top layer, from -bin.
var binaries = []string{"vpcipd", "vpcip-cni", "vpcipctl", "host-local"}

// iptablesNames are the commands go-iptables runs, linked to a backend (the
// ip6tables ones for an IPv6-mode node's rules).
var iptablesNames = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

func main() {
	bin := flag.String("bin", "", "directory holding linux_ARCH/ with the static vpcipd, vpcip-cni, vpcipctl and host-local of each architecture")
	roots := rootFlag{}
	flag.Var(roots, "root", "ARCH=DIR: unpacked Debian root of ARCH (a GOARCH) holding iptables and its libraries; repeat per architecture")
	out := flag.String("o", "", "path of the archive to write")
	name := flag.String("name", "localhost/vpcip/vpcip:0.1.0", "image reference recorded in the archive")
	flag.Parse()
	if err := run(*bin, roots, *out, *name); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// rootFlag maps a GOARCH to its unpacked Debian root (-root ARCH=DIR).
type rootFlag map[string]string

func (r rootFlag) String() string {
	var s []string
	for _, a := range r.arches() {
		s = append(s, a+"="+r[a])
	}
	return strings.Join(s, ",")
}

// Set takes one ARCH=DIR; an empty side (as a failed scripts/image-root.sh
// leaves it), an unknown architecture or a repeated one is an error.
func (r rootFlag) Set(v string) error {
	arch, dir, ok := strings.Cut(v, "=")
	if !ok || arch == "" || dir == "" {
		return fmt.Errorf("want ARCH=DIR, got %q", v)
	}
	if _, ok := elfMachine[arch]; !ok {
		return fmt.Errorf("architecture %q: mkimage builds for amd64 and arm64", arch)
	}
	if _, dup := r[arch]; dup {
		return fmt.Errorf("-root %s given twice", arch)
	}
	r[arch] = dir
	return nil
}

// arches returns the architectures, sorted (the order of the index).
func (r rootFlag) arches() []string {
	var a []string
	for k := range r {
		a = append(a, k)
	}
	sort.Strings(a)
	return a
}

// elfMachine is the ELF machine of each GOARCH the image is built for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkELF fails unless data is an ELF file for arch.
func checkELF(name string, data []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: not an ELF file: %w", name, err)
	}
	if want := elfMachine[arch]; f.Machine != want {
		return fmt.Errorf("%s is for %s, the %s image needs %s", name, f.Machine, arch, want)
	}
	return nil
}

func run(bin string, roots rootFlag, out, name string) error {
	if bin == "" || len(roots) == 0 || out == "" {
		return fmt.Errorf("-bin, -root and -o are required")
	}
	var imgs []ociarchive.Image
	for _, arch := range roots.arches() {
		img, err := image(filepath.Join(bin, "linux_"+arch), roots[arch], name, arch)
		if err != nil {
			return fmt.Errorf("linux/%s: %w", arch, err)
		}
		imgs = append(imgs, img)
	}
	var buf bytes.Buffer
	desc, err := ociarchive.WriteIndex(&buf, imgs)
	if err != nil {
		return err
	}
	if err := writeFile(out, buf.Bytes()); err != nil {
		return err
	}
	fmt.Printf("%s %s %s %d\n", out, name, desc.Digest, buf.Len())
	return nil
}

// image describes one architecture's two layers; its binaries come from bin.
func image(bin, root, name, arch string) (ociarchive.Image, error) {
	base, err := iptablesLayer(root, arch)
	if err != nil {
		return ociarchive.Image{}, fmt.Errorf("iptables layer from %s: %w", root, err)
	}
	var top []ociarchive.File
	for _, b := range binaries {
		p := filepath.Join(bin, b)
		data, err := os.ReadFile(p)
		if err != nil {
			return ociarchive.Image{}, err
		}
		if err := checkELF(p, data, arch); err != nil {
			return ociarchive.Image{}, err
		}
		top = append(top, ociarchive.File{Path: "/usr/local/bin/" + b, Mode: 0o755, Data: data})
	}
	return ociarchive.Image{
		Name: name, OS: "linux", Architecture: arch, Gzip: true,
		Entrypoint: []string{"/usr/local/bin/vpcipd"},
		Env:        []string{"PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Layers:     [][]ociarchive.File{base, top},
	}, nil
}

// iptablesLayer takes both iptables backends with their extensions and
// libraries from root, and links the command names to them.
func iptablesLayer(root, arch string) ([]ociarchive.File, error) {
	r, err := newRootFS(root, arch)
	if err != nil {
		return nil, err
	}
	for _, p := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/etc/protocols"} {
		if err := r.Add(p); err != nil {
			return nil, err
		}
	}
	if err := r.Glob(r.libDirs[1] + "/xtables/*.so"); err != nil {
		return nil, err
	}
	for _, n := range iptablesNames {
		r.Link("/usr/sbin/"+n, "xtables-nft-multi")
		r.Link("/usr/lib/vpcip/iptables-legacy/"+n, "/usr/sbin/xtables-legacy-multi")
	}
	return r.Files(), nil
}

// writeFile writes through a temporary file and a rename, so a cached
// archive is never half-written.
func writeFile(out string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}
