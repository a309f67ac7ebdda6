#!/usr/bin/env bash
# Installs the Debian packages vpcip's demo and tests need, if any is missing.
# Idempotent and quiet when everything is present. Needs root.
set -euo pipefail

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
for extra in "$@"; do
	case "$extra" in
	containerd) command -v containerd >/dev/null 2>&1 || need+=(containerd) ;;
	runc) command -v runc >/dev/null 2>&1 || need+=(runc) ;;
	promtool) command -v promtool >/dev/null 2>&1 || need+=(prometheus) ;;
	valgrind) command -v valgrind >/dev/null 2>&1 || need+=(valgrind) ;;
	etcd-server) command -v etcd >/dev/null 2>&1 || need+=(etcd-server) ;;
	qemu-user-static) command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static) ;;
	*) need+=("$extra") ;;
	esac
done
if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing ${need[*]}; run as root to install them" >&2
	exit 1
fi
echo "deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
