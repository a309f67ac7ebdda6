#!/usr/bin/env bash
# Builds gotestsum at the version tools/gotestsum pins, from the Go module
# proxy, and prints the binary's path on the last line of stdout. Idempotent:
# a binary already built for the same go.mod, go.sum and Go release is kept.
#
#   VPCIP_GOTESTSUM_BIN  where the binary goes (default
#                        /var/cache/vpcip/gotestsum-<key>/bin); must be writable.
#
# Built with CGO_ENABLED=0 and -trimpath like vpcip, with the golang.org/x
# modules at vpcip's versions, so they compile once. Cold: about 1 CPU-minute.
set -euo pipefail
cd "$(dirname "$0")/.."

export CGO_ENABLED=0
key=$( (go version; echo "CGO_ENABLED=$CGO_ENABLED -trimpath"; cat tools/gotestsum/go.mod tools/gotestsum/go.sum) | sha256sum | cut -c1-12)
bin=${VPCIP_GOTESTSUM_BIN:-/var/cache/vpcip/gotestsum-$key/bin}
mkdir -p "$bin"
if [ ! -x "$bin/gotestsum" ]; then
	echo "gotestsum: building into $bin" >&2
	(cd tools/gotestsum && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin/gotestsum.tmp" gotest.tools/gotestsum) >&2
	mv "$bin/gotestsum.tmp" "$bin/gotestsum"
fi
echo "$bin/gotestsum"
