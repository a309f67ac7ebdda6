#!/usr/bin/env bash
# Checks, before `make test` builds or runs anything, what its tests depend
# on in this machine: root, the Go release, the kernel's network namespaces,
# veth pairs and policy routing, iptables, free disk, and whether valgrind
# can run Go code on this processor (the bench's instruction count). A
# missing hard requirement stops here with its reason, not as a crash deep
# in a test; a soft one is reported and the affected figure says so.
# Run after scripts/deps.sh (which installs iproute2, iptables, valgrind).
set -uo pipefail
cd "$(dirname "$0")/.."

fail=0
ok() { printf 'preflight: %-22s %s\n' "$1" "$2"; }
bad() { printf 'preflight: %-22s FAILED: %s\n' "$1" "$2" >&2; fail=1; }

# Root: network and mount namespaces, iptables, containerd, kubelet.
if [ "$(id -u)" -eq 0 ]; then ok root yes; else bad root "make test needs root (netns, iptables, containerd, kubelet)"; fi

# Go: the release go.mod names or newer.
want=$(awk '/^go /{print $2; exit}' go.mod)
have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
if [ -z "$have" ]; then
	bad go "go is not on PATH"
elif [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
	bad go "go $have is older than go.mod's $want"
else
	ok go "$have (go.mod: $want)"
fi

# Processor and kernel, for the record (results differ by processor).
cpu=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
ok processor "${cpu:-unknown} ($(nproc) cores, $(uname -m))"
ok kernel "$(uname -r); cgroup $( [ -f /sys/fs/cgroup/cgroup.controllers ] && echo v2 || echo v1)"

# Network namespaces, a veth pair across two of them, a policy rule: the
# datapath every netns test builds on. Names are this run's own.
if [ "$(id -u)" -eq 0 ]; then
	a=vpcip-pf-a-$$ b=vpcip-pf-b-$$
	cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
	trap cleanup EXIT
	if ! out=$(ip netns add "$a" 2>&1 && ip netns add "$b" 2>&1); then
		bad netns "ip netns add: $out"
	elif ! out=$(ip -n "$a" link add pf0 type veth peer name pf1 netns "$b" 2>&1); then
		bad veth "veth pair across namespaces: $out"
	elif ! out=$(ip -n "$a" rule add from 192.0.2.1 lookup 100 prio 1000 2>&1); then
		bad "policy routing" "ip rule: $out"
	else
		ok "netns, veth, rules" yes
	fi
	cleanup
	trap - EXIT
	if out=$(iptables -t nat -L -n 2>&1 >/dev/null); then ok iptables "$(iptables --version)"; else bad iptables "$out"; fi
fi

# Disk: cold builds put ~8 GB in the Go build cache and /var/cache/vpcip.
# (the Go build cache's file system: its nearest existing directory).
d=$(go env GOCACHE 2>/dev/null || echo "$HOME")
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
free_gb=$(df -Pk "$d" | awk 'NR==2{print int($4/1048576)}')
if [ "${free_gb:-0}" -lt 10 ]; then bad disk "${free_gb} GB free; cold builds need about 10"; else ok disk "${free_gb} GB free"; fi

# valgrind on this processor: the bench's instruction count (e). Soft: the
# bench reports the figure "unavailable" with valgrind's reason.
if command -v valgrind >/dev/null 2>&1; then
	if out=$(go test -count=1 -run '^TestValgrindRunsGoCode$' ./test/bench/ 2>&1); then
		ok valgrind "$(valgrind --version) runs Go code under cachegrind"
	else
		printf 'preflight: %-22s %s\n' valgrind "cannot run Go code on this processor; make bench reports (e) unavailable:" >&2
		echo "$out" | grep -E 'unavailable|Unrecognised|FAIL' | head -3 >&2
	fi
else
	ok valgrind "not installed (scripts/deps.sh valgrind)"
fi

if [ "$fail" -ne 0 ]; then
	echo "preflight: a requirement above is missing; make test would fail on it" >&2
	exit 1
fi
