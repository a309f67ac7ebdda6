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
# Cold (2 cores): kube-apiserver ~6 min, all five ~15 min, helm ~2 min each.
set -euo pipefail
cd "$(dirname "$0")/.."

k8s_version=v1.37.2
helm3_version=v3.22.0
helm4_version=v4.3.1
key=$( (go version; cat tools/k8s/go.mod tools/k8s/go.sum; echo "$helm3_version $helm4_version") | sha256sum | cut -c1-12)
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

# Helm from the module proxy, in a scratch directory so its modules never touch our go.mod.
helm_install() {
	local name=$1 pkg=$2
	[ -x "$bin/$name" ] && return 0
	echo "k8s-tools: building $name ($pkg)" >&2
	local scratch
	scratch=$(mktemp -d)
	(cd "$scratch" && GOBIN=$scratch GOFLAGS= go install -ldflags "-s -w" "$pkg" && mv "$scratch/helm" "$bin/$name") >&2
	rm -rf "$scratch"
}
helm_install helm "helm.sh/helm/v3/cmd/helm@$helm3_version"
helm_install helm4 "helm.sh/helm/v4/cmd/helm@$helm4_version"

echo "$bin"
