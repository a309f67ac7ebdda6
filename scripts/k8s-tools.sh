#!/usr/bin/env bash
# Builds the Kubernetes binaries vpcip's test clusters run, from the Go module
# proxy (tools/k8s pins k8s.io/kubernetes v1.37.2), plus Helm 3 and Helm 4, and
# installs etcd from Debian. Idempotent: a binary already built for the same
# module versions and Go release is kept, so a warm re-run takes about a second.
# Needs root (apt-get) and go.
#
#   VPCIP_K8S_BIN   where the binaries go (default /var/cache/vpcip/k8s-<key>/bin);
#                   the script prints this directory on its last line of stdout.
#
# Helm comes from the same module (tools/k8s requires helm.sh/helm/v3 and v4),
# so the Kubernetes libraries the two Helms and the five binaries share are
# compiled once. Everything is built in the configuration `make test` builds
# vpcip in (CGO_ENABLED=0, -trimpath), and tools/k8s requires the same
# versions of the modules both use (test/deps checks it), so client-go,
# k8s.io/api, gRPC and the rest come from the build cache afterwards.
#
# Cold (2 cores): kube-apiserver ~6 min, all five ~15 min, then both Helms.
set -euo pipefail
cd "$(dirname "$0")/.."

k8s_version=v1.37.2
export CGO_ENABLED=0
key=$( (go version; echo "CGO_ENABLED=$CGO_ENABLED -trimpath"; cat tools/k8s/go.mod tools/k8s/go.sum) | sha256sum | cut -c1-12)
bin=${VPCIP_K8S_BIN:-/var/cache/vpcip/k8s-$key/bin}
mkdir -p "$bin"

bash scripts/deps.sh etcd-server >&2

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
missing=()
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
	[ -x "$bin/$cmd" ] || missing+=("k8s.io/kubernetes/cmd/$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "k8s-tools: building ${missing[*]##*/} ($k8s_version) into $bin" >&2
	(cd tools/k8s && GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$bin/" "${missing[@]}") >&2
fi

# Helm 3 and Helm 4 from the same module, with the same -trimpath, so every
# package they share with the Kubernetes binaries comes from the build cache.
for h in "helm helm.sh/helm/v3/cmd/helm" "helm4 helm.sh/helm/v4/cmd/helm"; do
	set -- $h
	[ -x "$bin/$1" ] && continue
	echo "k8s-tools: building $1 ($2)" >&2
	(cd tools/k8s && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin/$1" "$2") >&2
done

echo "$bin"
