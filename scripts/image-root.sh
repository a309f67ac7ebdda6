#!/usr/bin/env bash
# Unpacks the Debian packages vpcip's image takes its iptables userland from
# (build/mkimage picks the files it needs out of this root) and prints the
# root's directory on its last line of stdout. The packages are fetched with
# `apt-get download` and unpacked with `dpkg-deb -x`; nothing is installed.
# Cached by architecture and package versions: a warm re-run takes about a
# second, and the same versions always give the same root (so the same image
# digest).
#
#   bash scripts/image-root.sh [ARCH]   Debian architecture (amd64, arm64);
#                                       default the machine's own
#
# For another architecture than the machine's, dpkg learns it as a foreign
# architecture (`dpkg --add-architecture`, needs root) so that `apt-get
# update` fetches its package lists; its packages are downloaded as
# PACKAGE:ARCH.
#
#   VPCIP_IMAGE_ROOT   cache directory (default /var/cache/vpcip/image-root)
set -euo pipefail

native=$(dpkg --print-architecture)
arch=${1:-$native}
packages=(iptables libxtables12 libip4tc2 libip6tc2 libnftnl11 libmnl0
	libnetfilter-conntrack3 libnfnetlink0 libc6)
all=(netbase) # Architecture: all
cache=${VPCIP_IMAGE_ROOT:-/var/cache/vpcip/image-root}

update=
if [ "$arch" != "$native" ]; then
	packages=("${packages[@]/%/:$arch}")
	if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
		echo "image-root: dpkg --add-architecture $arch (for its package lists)" >&2
		dpkg --add-architecture "$arch"
		update=1
	fi
fi
packages+=("${all[@]}")

versions() {
	apt-cache policy "${packages[@]}" 2>/dev/null | awk '/^[^ ]/{p=$1} /Candidate:/{print p, $2}'
}
list=$(versions)
if [ -n "$update" ] || [ "$(echo "$list" | grep -vc '(none)')" -ne ${#packages[@]} ]; then
	apt-get update -qq >/dev/null
	list=$(versions)
fi
if [ "$(echo "$list" | grep -vc '(none)')" -ne ${#packages[@]} ]; then
	echo "image-root: apt has no candidate for some of ${packages[*]}:" >&2
	echo "$list" >&2
	exit 1
fi
key=$( (echo "$list"; echo "$arch") | sha256sum | cut -c1-16)
dir=$cache/$key
if [ ! -f "$dir/done" ]; then
	echo "image-root: unpacking ${packages[*]} into $dir" >&2
	rm -rf "$dir"
	mkdir -p "$dir/debs" "$dir/root"
	(cd "$dir/debs" && apt-get download -qq -o APT::Sandbox::User=root "${packages[@]}" >/dev/null)
	for deb in "$dir"/debs/*.deb; do
		dpkg-deb -x "$deb" "$dir/root"
	done
	echo "$list" >"$dir/versions"
	touch "$dir/done"
fi
echo "$dir/root"
