package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// imageEnv names the archive `make image` wrote; `make test` sets it.
const imageEnv = "VPCIP_IMAGE"

// requireEnv makes a missing archive, qemu-user-static or root a failure
// instead of a skip; `make test` sets it, and CI=true (.ci/run) does the same.
const requireEnv = "VPCIP_REQUIRE_QEMU"

// qemuArch is qemu's name of each GOARCH the image is built for.
var qemuArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" || os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// The archive `make image` wrote is one image for linux/amd64 and
// linux/arm64, and each platform's file tree is usable on its architecture:
// every ELF file in it is for that architecture (vpcip's binaries static),
// its config names the platform, and, run in the unpacked tree with chroot
// (under Debian's qemu-user-static for the other architecture), its vpcipd
// and vpcip-cni answer with their versions and both iptables backends start
// with their libraries and report their version.
func TestImageArchiveRunsOnEachArchitecture(t *testing.T) {
	archive := os.Getenv(imageEnv)
	if _, err := os.Stat(archive); archive == "" || err != nil {
		skipOrFail(t, "set "+imageEnv+" to the archive `make image` writes (bin/vpcip-image.tar)")
	}
	if os.Geteuid() != 0 {
		skipOrFail(t, "chroot needs root")
	}
	multi, name := readImageIndex(t, archive)
	mm, err := multi.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range mm.Manifests {
		if m.Platform != nil {
			got = append(got, m.Platform.OS+"/"+m.Platform.Architecture)
		}
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(got, want) || len(mm.Manifests) != len(want) {
		t.Fatalf("%s lists platforms %v (%d manifests), want %v", name, got, len(mm.Manifests), want)
	}
	versions := map[string]string{}
	for _, m := range mm.Manifests {
		arch := m.Platform.Architecture
		t.Run("linux/"+arch, func(t *testing.T) {
			if m.MediaType != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s, want %s", m.MediaType, types.OCIManifestSchema1)
			}
			img, err := multi.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != arch {
				t.Errorf("config says %s/%s, the index says linux/%s", cf.OS, cf.Architecture, arch)
			}
			root := t.TempDir()
			unpack(t, img, root)
			checkELFFiles(t, root, arch)
			versions[arch] = runInImage(t, root, arch)
		})
	}
	if len(versions) == 2 && versions["amd64"] != versions["arm64"] {
		t.Errorf("vpcipd -version: amd64 %q, arm64 %q; want one version", versions["amd64"], versions["arm64"])
	}
}

// readImageIndex opens the archive with go-containerregistry's layout reader
// and returns the image index its index.json names, and the image's name.
func readImageIndex(t *testing.T, archive string) (v1.ImageIndex, string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if hdr.Typeflag != tar.TypeReg || !filepath.IsLocal(hdr.Name) {
			t.Fatalf("%s: unexpected entry %s (type %c)", archive, hdr.Name, hdr.Typeflag)
		}
		writeFrom(t, filepath.Join(dir, hdr.Name), tr, 0o644)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("%s: index.json lists %+v, want one OCI image index", archive, tm.Manifests)
	}
	d := tm.Manifests[0]
	name := d.Annotations[ociarchive.AnnotationImageName]
	if name == "" {
		t.Errorf("%s: the image index carries no %s annotation (ctr images import names the image by it)", archive, ociarchive.AnnotationImageName)
	}
	multi, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return multi, name
}

func writeFrom(t *testing.T, p string, r io.Reader, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, r); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// unpack writes the image's flattened file system (go-containerregistry's
// mutate.Extract) under root.
func unpack(t *testing.T, img v1.Image, root string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(hdr.Name) {
			t.Fatalf("layer entry %q leaves the root", hdr.Name)
		}
		p := filepath.Join(root, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			writeFrom(t, p, tr, os.FileMode(hdr.Mode).Perm())
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.Symlink(hdr.Linkname, p)
			}
		default:
			t.Fatalf("layer entry %s has type %c", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// checkELFFiles fails for any ELF file under root that is not for arch, and
// for a vpcip binary that is missing or not static.
func checkELFFiles(t *testing.T, root, arch string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return nil // not ELF (/etc/protocols)
		}
		defer f.Close()
		n++
		rel, _ := filepath.Rel(root, p)
		if f.Machine != elfMachine[arch] {
			t.Errorf("/%s is for %s, in the %s image", rel, f.Machine, arch)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range binaries {
		f, err := elf.Open(filepath.Join(root, "usr/local/bin", b))
		if err != nil {
			t.Errorf("/usr/local/bin/%s: %v", b, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("/usr/local/bin/%s is dynamically linked; the image's binaries are static", b)
			}
		}
		f.Close()
	}
	if n < len(binaries)+2 {
		t.Errorf("%d ELF files in the %s image, want vpcip's and iptables' at least", n, arch)
	}
	t.Logf("%s: %d ELF files, all %s", arch, n, elfMachine[arch])
}

// runInImage runs the image's programs in its unpacked tree with chroot,
// under qemu-user-static when arch is not the host's, and returns vpcipd's
// version line.
func runInImage(t *testing.T, root, arch string) string {
	t.Helper()
	var prefix []string
	if arch != runtime.GOARCH {
		qemu, err := exec.LookPath("qemu-" + qemuArch[arch] + "-static")
		if err != nil {
			skipOrFail(t, "qemu-"+qemuArch[arch]+"-static is not installed (scripts/deps.sh qemu-user-static; make test installs it)")
		}
		data, err := os.ReadFile(qemu)
		if err != nil {
			t.Fatal(err)
		}
		writeFrom(t, filepath.Join(root, "qemu"), bytes.NewReader(data), 0o755)
		prefix = []string{"/qemu"}
	}
	run := func(env []string, stdin string, args ...string) string {
		cmd := exec.Command("chroot", append(append([]string{root}, prefix...), args...)...)
		cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("chroot %s: %v", strings.Join(args, " "), err)
		}
		if err != nil {
			t.Errorf("%s (%s): %v: %s", strings.Join(args, " "), arch, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	version := run(nil, "", "/usr/local/bin/vpcipd", "-version")
	if !strings.HasPrefix(version, "vpcipd ") {
		t.Errorf("vpcipd -version (%s) printed %q", arch, version)
	}
	if out := run([]string{"CNI_COMMAND=VERSION"}, `{"cniVersion":"1.0.0"}`, "/usr/local/bin/vpcip-cni"); !strings.Contains(out, `"supportedVersions"`) {
		t.Errorf("vpcip-cni VERSION (%s) printed %q", arch, out)
	}
	// iptables-save and iptables-restore are the nf_tables backend's
	// xtables-nft-multi, as `iptables` is; `iptables --version` itself
	// opens a NETLINK_NETFILTER socket first, which qemu-user does not
	// translate ("Failed to initialize nft: Protocol not supported"), so it
	// runs on the host's architecture only.
	cmds := map[string]string{
		"/usr/sbin/iptables-save":                      "(nf_tables)",
		"/usr/sbin/iptables-restore":                   "(nf_tables)",
		"/usr/lib/vpcip/iptables-legacy/iptables":      "(legacy)",
		"/usr/lib/vpcip/iptables-legacy/iptables-save": "(legacy)",
	}
	if prefix == nil {
		cmds["/usr/sbin/iptables"] = "(nf_tables)"
	}
	for cmd, want := range cmds {
		if out := run(nil, "", cmd, "--version"); !strings.Contains(out, want) {
			t.Errorf("%s --version (%s) printed %q, want %s", cmd, arch, out, want)
		}
	}
	t.Logf("%s: %s", arch, version)
	return version
}
