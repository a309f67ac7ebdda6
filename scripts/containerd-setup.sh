#!/usr/bin/env bash
# Prepares the container runtime tests (test/containerd): containerd and runc
# from Debian, the reference CNI plugins from the Go module proxy,
# and the pod sandbox (pause) image built from test/containerd/pause as an OCI
# archive. Idempotent: each step is skipped when its output is present, so a
# re-run takes about a second. Needs root (apt-get) and go.
#
#   VPCIP_CONTAINERD_TOOLS  the pause archive (default /tmp/vpcip-containerd-tools)
#   VPCIP_CNI_PLUGINS       reference CNI plugins (default /tmp/vpcip-cni-plugins)
#   VPCIP_CONTAINERD2_BIN   containerd 2 binaries (default /tmp/vpcip-containerd2/bin)
#
# With --containerd2 it also builds containerd 2 (containerd, shim, ctr) from
# the module proxy, for the scenarios that need CNI 1.1.0 results.
#
# The tests speak CRI over gRPC themselves; crictl is not needed.
# Cold: apt ~30 s, plugins ~10 s, pause image ~5 s; containerd 2 ~100 s more.
set -euo pipefail
cd "$(dirname "$0")/.."

tools=${VPCIP_CONTAINERD_TOOLS:-/tmp/vpcip-containerd-tools}
plugins=${VPCIP_CNI_PLUGINS:-/tmp/vpcip-cni-plugins}
containerd2=${VPCIP_CONTAINERD2_BIN:-/tmp/vpcip-containerd2/bin}
want_containerd2=
for arg in "$@"; do
	case "$arg" in
	--containerd2) want_containerd2=1 ;;
	*)
		echo "usage: $0 [--containerd2]" >&2
		exit 2
		;;
	esac
done
plugins_version=v1.10.0
containerd2_version=v2.4.2

# go install in a scratch directory, so the tools' modules never touch our go.mod.
# Built in the configuration make test builds vpcip in (CGO_ENABLED=0,
# -trimpath), as the plugins' own release builds are static: the standard
# library and the modules they share with vpcip (x/sys, gRPC, protobuf, ...)
# then compile once. With cgo and without -trimpath they compiled a second
# time, which took the reference plugins from about 9 s to 154 s cold.
go_install() {
	local gobin=$1
	shift
	local scratch
	mkdir -p "$gobin"
	scratch=$(mktemp -d)
	(cd "$scratch" && GOBIN=$gobin CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" go install "$@")
	rmdir "$scratch"
}

bash scripts/deps.sh containerd runc

missing=()
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
	[ -x "$plugins/$(basename "$p")" ] || missing+=("github.com/containernetworking/plugins/plugins/$p@$plugins_version")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "containerd-setup: building reference CNI plugins $plugins_version"
	go_install "$plugins" "${missing[@]}"
fi

# The pause archive is rebuilt when its sources or the Go release change.
key=$( (go version; cat test/containerd/pause/*.go test/containerd/mkpause/*.go \
	test/containerd/ociarchive/*.go) | sha256sum | cut -c1-16)
if [ "$(cat "$tools/pause/key" 2>/dev/null)" != "$key" ] || [ ! -s "$tools/pause/pause.tar" ]; then
	echo "containerd-setup: building the pause image"
	mkdir -p "$tools/pause"
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tools/pause/pause" ./test/containerd/pause
	go run ./test/containerd/mkpause -bin "$tools/pause/pause" -o "$tools/pause/pause.tar" >/dev/null
	echo "$key" >"$tools/pause/key"
fi

if [ -n "$want_containerd2" ] && [ ! -x "$containerd2/containerd-shim-runc-v2" ]; then
	echo "containerd-setup: building containerd $containerd2_version"
	go_install "$containerd2" -tags=no_btrfs \
		"github.com/containerd/containerd/v2/cmd/containerd@$containerd2_version" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd2_version" \
		"github.com/containerd/containerd/v2/cmd/ctr@$containerd2_version"
fi
