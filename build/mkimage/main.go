// Command mkimage builds vpcip's container image as an OCI archive that
// `ctr -n k8s.io images import` loads, without Docker or a registry.
//
//	mkimage -bin bin/image -root /var/cache/vpcip/image-root/<key>/root \
//	        -o bin/vpcip-image.tar [-name localhost/vpcip/vpcip:0.1.0]
//
// Two layers, bottom first:
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
//  2. vpcipd, vpcip-cni and vpcipctl from -bin (static, CGO_ENABLED=0) in
//     /usr/local/bin; vpcipd is the entrypoint, and `vpcipd install-cni`
//     copies vpcip-cni from beside itself.
//
// The output is reproducible: the same binaries and packages give the same
// bytes and digest. It prints the archive's path, the reference, the
// manifest digest and the archive's size in bytes.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// binaries are the programs of the image's top layer, from -bin.
var binaries = []string{"vpcipd", "vpcip-cni", "vpcipctl"}

// iptablesNames are the commands go-iptables runs, linked to a backend.
var iptablesNames = []string{"iptables", "iptables-save", "iptables-restore"}

func main() {
	bin := flag.String("bin", "", "directory holding the static vpcipd, vpcip-cni and vpcipctl")
	root := flag.String("root", "", "unpacked Debian root holding iptables and its libraries")
	out := flag.String("o", "", "path of the archive to write")
	name := flag.String("name", "localhost/vpcip/vpcip:0.1.0", "image reference recorded in the archive")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the binaries and packages")
	flag.Parse()
	if err := run(*bin, *root, *out, *name, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(bin, root, out, name, arch string) error {
	if bin == "" || root == "" || out == "" {
		return fmt.Errorf("-bin, -root and -o are required")
	}
	img, err := image(bin, root, name, arch)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	desc, err := ociarchive.Write(&buf, img)
	if err != nil {
		return err
	}
	if err := writeFile(out, buf.Bytes()); err != nil {
		return err
	}
	fmt.Printf("%s %s %s %d\n", out, name, desc.Digest, buf.Len())
	return nil
}

// image describes the two layers.
func image(bin, root, name, arch string) (ociarchive.Image, error) {
	base, err := iptablesLayer(root, arch)
	if err != nil {
		return ociarchive.Image{}, fmt.Errorf("iptables layer from %s: %w", root, err)
	}
	var top []ociarchive.File
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(bin, b))
		if err != nil {
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
