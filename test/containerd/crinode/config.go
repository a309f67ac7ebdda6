package crinode

import (
	"fmt"
	"io"
	"strconv"
	"text/template"
)

// configParams fills configTemplate. Every path is absolute.
type configParams struct {
	Version    int // containerd config schema: 2 for containerd 1.6, 3 for 2.x
	Root       string
	State      string
	Socket     string
	RuncRoot   string
	OptDir     string
	CNIBinDir  string
	CNIConfDir string
	Runc       string
	Pause      string
	// HostNetnsDir: pod netns go to /var/run/netns, as a containerd of a
	// real node puts them, not under State (see Config.HostNetnsDir).
	HostNetnsDir bool
}

// configTemplate is a containerd config with the CRI plugin and runc only.
//
// restrict_oom_score_adj: the test VMs lack CAP_SYS_RESOURCE, so runc cannot
// lower oom_score_adj and every sandbox fails ("can't get final child's PID
// from pipe: EOF") unless the CRI plugin clamps it to containerd's own value.
// netns_mounts_under_state_dir keeps each node's pod network namespaces under
// its own state directory instead of the shared /var/run/netns, unless
// HostNetnsDir asks for the real nodes' place.
// Each instance gets its own root, state, socket, runc state and opt dir, so
// one can run per node on a single machine.
var configTemplate = template.Must(template.New("config").Funcs(template.FuncMap{"q": strconv.Quote}).Parse(`
{{- if eq .Version 2 -}}
version = 2
root = {{q .Root}}
state = {{q .State}}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {{q .Socket}}

[ttrpc]
  address = {{q (printf "%s.ttrpc" .Socket)}}

[plugins."io.containerd.internal.v1.opt"]
  path = {{q .OptDir}}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {{q .Pause}}
  restrict_oom_score_adj = true
  enable_selinux = false
  netns_mounts_under_state_dir = {{not .HostNetnsDir}}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {{q .CNIBinDir}}
    conf_dir = {{q .CNIConfDir}}
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = {{q .Runc}}
        Root = {{q .RuncRoot}}
        SystemdCgroup = false
{{- else -}}
version = 3
root = {{q .Root}}
state = {{q .State}}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]

[grpc]
  address = {{q .Socket}}

[ttrpc]
  address = {{q (printf "%s.ttrpc" .Socket)}}

[plugins."io.containerd.internal.v1.opt"]
  path = {{q .OptDir}}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {{q .Pause}}

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_selinux = false
  netns_mounts_under_state_dir = {{not .HostNetnsDir}}
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{{q .CNIBinDir}}]
    conf_dir = {{q .CNIConfDir}}
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {{q .Runc}}
        Root = {{q .RuncRoot}}
        SystemdCgroup = false
{{- end}}
`))

func writeConfig(w io.Writer, p configParams) error {
	if p.Version != 2 && p.Version != 3 {
		return fmt.Errorf("crinode: containerd config version %d not supported (want 2 or 3)", p.Version)
	}
	return configTemplate.Execute(w, p)
}
