#!/usr/bin/env bash
# Builds golangci-lint at the version tools/golangci pins, from the Go module
# proxy, and prints the binary's path on the last line of stdout. Idempotent:
# a binary already built for the same go.mod, go.sum and Go release is kept,
# so a warm run takes a fraction of a second.
#
#   VPCIP_GOLANGCI_BIN   where the binary goes (default
#                        /var/cache/vpcip/golangci-<key>/bin); must be writable.
#
# Built with CGO_ENABLED=0 and -trimpath, the configuration `make test` builds
# vpcip in, so the modules golangci-lint shares with vpcip (golang.org/x/tools,
# x/mod, x/sync, ...) are compiled once if their versions agree. Cold: about
# 6.5 CPU-minutes (29 min wall on 2 cores shared with other builds, load ~25).
set -euo pipefail
cd "$(dirname "$0")/.."

export CGO_ENABLED=0
key=$( (go version; echo "CGO_ENABLED=$CGO_ENABLED -trimpath"; cat tools/golangci/go.mod tools/golangci/go.sum) | sha256sum | cut -c1-12)
bin=${VPCIP_GOLANGCI_BIN:-/var/cache/vpcip/golangci-$key/bin}
mkdir -p "$bin"
# One build at a time: make test starts this script early, beside the
# Kubernetes build, and make lint calls it again later; the second waits for
# the first and finds the binary.
exec 9>"$bin/.lock"
flock 9
if [ ! -x "$bin/golangci-lint" ]; then
	version=$(cd tools/golangci && go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)
	echo "golangci-lint: building $version into $bin" >&2
	(cd tools/golangci && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin/golangci-lint.tmp" github.com/golangci/golangci-lint/v2/cmd/golangci-lint) >&2
	mv "$bin/golangci-lint.tmp" "$bin/golangci-lint"
fi
echo "$bin/golangci-lint"
