#!/usr/bin/env bash
# Builds one reference CNI plugin (containernetworking/plugins, the release
# test/cnitest.ReferenceVersion names) for linux/ARCH, static and stripped,
# into DIR: the image ships host-local, which IPv6 pods' IPv4 egress
# delegates to. `go install pkg@version` builds outside this module (the
# plugins' dependencies are not in go.sum); with GOBIN unset it writes to
# GOPATH/bin (GOPATH/bin/linux_ARCH for another architecture), so GOPATH is
# a scratch directory while the module and build caches stay the user's.
#
#   bash scripts/reference-plugin.sh ARCH PLUGIN DIR   e.g. amd64 ipam/host-local bin/image/linux_amd64
set -euo pipefail
arch=$1 plugin=$2 dir=$3
version=v1.10.0 # test/cnitest.ReferenceVersion
modcache=$(go env GOMODCACHE)
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
GOBIN= GOPATH=$gopath GOMODCACHE=$modcache GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0 GOOS=linux GOARCH=$arch \
	go install -ldflags='-s -w' "github.com/containernetworking/plugins/plugins/$plugin@$version"
name=$(basename "$plugin")
built=$gopath/bin/linux_$arch/$name
[ -f "$built" ] || built=$gopath/bin/$name
mkdir -p "$dir"
cp "$built" "$dir/$name"
