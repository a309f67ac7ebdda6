package crinode

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// DefaultToolsDir is where scripts/containerd-setup.sh caches the pause image
// archive (environment VPCIP_CONTAINERD_TOOLS overrides it).
const DefaultToolsDir = "/tmp/vpcip-containerd-tools"

// DefaultPluginDir is where the reference CNI plugins are cached, shared with
// the end-to-end tests (environment VPCIP_CNI_PLUGINS overrides it).
const DefaultPluginDir = "/tmp/vpcip-cni-plugins"

// DefaultContainerd2Dir holds containerd 2 (containerd, containerd-shim-runc-v2,
// ctr) built from source by `scripts/containerd-setup.sh --containerd2`
// (environment VPCIP_CONTAINERD2_BIN overrides it).
const DefaultContainerd2Dir = "/tmp/vpcip-containerd2/bin"

// SetupHint tells a reader how to get the tools FindTools looks for.
const SetupHint = "run `bash scripts/containerd-setup.sh` as root (add --containerd2 for containerd 2; CI runs it before `make test`)"

// Tools are the programs and files a Node needs.
type Tools struct {
	Label        string // "debian" (containerd on PATH) or "containerd2" (built from source)
	Containerd   string // containerd binary; its directory also provides containerd-shim-runc-v2
	Ctr          string // ctr of the same containerd release
	Runc         string // runc binary
	PauseArchive string // OCI archive of PauseImage
	PluginDir    string // reference CNI plugins (bridge, host-local, loopback, portmap)
}

// Containerd2Dir is where containerd 2 is looked for: VPCIP_CONTAINERD2_BIN or
// DefaultContainerd2Dir.
func Containerd2Dir() string { return envOr("VPCIP_CONTAINERD2_BIN", DefaultContainerd2Dir) }

// FindTools locates the tools: containerd, its shim and ctr in containerdDir,
// or on PATH (Debian's packages) when containerdDir is ""; runc on PATH;
// the pause archive (built by scripts/containerd-setup.sh from
// test/containerd/pause) in VPCIP_CONTAINERD_TOOLS (default
// DefaultToolsDir); the reference plugins in VPCIP_CNI_PLUGINS (default
// DefaultPluginDir). The error lists everything missing and ends with SetupHint.
func FindTools(containerdDir string) (Tools, error) {
	toolsDir := envOr("VPCIP_CONTAINERD_TOOLS", DefaultToolsDir)
	t := Tools{
		Label:        "debian",
		PauseArchive: filepath.Join(toolsDir, "pause", "pause.tar"),
		PluginDir:    envOr("VPCIP_CNI_PLUGINS", DefaultPluginDir),
	}
	if containerdDir != "" {
		t.Label = "containerd2"
	}
	var errs []error
	for _, p := range []struct {
		dst  *string
		dir  string
		name string
	}{
		{&t.Containerd, containerdDir, "containerd"},
		{new(string), containerdDir, "containerd-shim-runc-v2"},
		{&t.Ctr, containerdDir, "ctr"},
		{&t.Runc, "", "runc"},
	} {
		path, err := lookTool(p.dir, p.name)
		if err != nil {
			errs = append(errs, err)
		}
		*p.dst = path
	}
	for _, f := range []string{t.PauseArchive, filepath.Join(t.PluginDir, "loopback")} {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("%s is missing", f))
		}
	}
	if len(errs) > 0 {
		return t, fmt.Errorf("crinode: %w; %s", errors.Join(errs...), SetupHint)
	}
	return t, nil
}

func lookTool(dir, name string) (string, error) {
	if dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s not in %s", name, dir)
		}
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not on PATH", name)
	}
	return p, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// versionPattern finds the release in `containerd --version`, e.g.
// "containerd github.com/containerd/containerd 1.6.20~ds1 ..." or
// "containerd github.com/containerd/containerd/v2 v2.4.2 ...".
var versionPattern = regexp.MustCompile(`\sv?(\d+)\.(\d+)\.\d+`)

// ContainerdMajor returns the major release of the containerd binary (1 or 2).
func ContainerdMajor(ctx context.Context, containerd string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, containerd, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("crinode: %s --version: %w", containerd, err)
	}
	return parseMajor(out)
}

func parseMajor(out []byte) (int, error) {
	m := versionPattern.FindSubmatch(bytes.TrimSpace(out))
	if m == nil {
		return 0, fmt.Errorf("crinode: no release in containerd version %q", out)
	}
	return strconv.Atoi(string(m[1]))
}

// MaxCNIVersion is the newest CNI result version a containerd major release
// accepts: containerd 1.6 refuses 1.1.0 results ("unsupported CNI result
// version"); containerd 2.x parses them.
func MaxCNIVersion(major int) string {
	if major >= 2 {
		return "1.1.0"
	}
	return "1.0.0"
}

// imageName returns the image reference an OCI archive's index.json records
// (the io.containerd.image.name annotation `ctr images import` uses), so the
// CRI config names exactly the image that is imported.
func imageName(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("crinode: pause image: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("crinode: no index.json in %s: %v", archive, err)
		}
		if hdr.Name != "index.json" {
			continue
		}
		var index v1.IndexManifest
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			return "", fmt.Errorf("crinode: %s index.json: %w", archive, err)
		}
		for _, m := range index.Manifests {
			if name := m.Annotations[ociarchive.AnnotationImageName]; name != "" {
				return name, nil
			}
		}
		return "", fmt.Errorf("crinode: %s names no image (%s)", archive, ociarchive.AnnotationImageName)
	}
}

// ImageName returns the image reference an OCI archive records for
// `ctr images import` (e.g. the pause archive's "localhost/vpcip/pause:1").
func ImageName(archive string) (string, error) { return imageName(archive) }
