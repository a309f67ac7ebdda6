#!/usr/bin/env bash
# run-tests.sh JSONFILE GO-TEST-ARGS...: runs `go test -json GO-TEST-ARGS`
# through gotestsum (scripts/gotestsum.sh), which prints a line for each
# package as it ends and each failed test's output at once, and at the end
# names every failed test. Every 2 minutes (VPCIP_TEST_BEAT seconds) a line says which top-level tests
# are still running (a package such as test/e2e takes about 9 minutes, and
# go test prints nothing for it until it ends). Writes go test's JSON events
# to JSONFILE (scripts/test-report.sh reads it). Exits as go test did.
set -uo pipefail
json=$1
shift
gotestsum=$(bash "$(dirname "$0")/gotestsum.sh" | tail -n 1) || exit 1
: >"$json"

# running JSONFILE: the top-level tests started and not yet ended, one per line.
running() {
	awk '
	function field(name,   m) { if (match($0, "\"" name "\":\"[^\"]*\"")) { m = substr($0, RSTART, RLENGTH); sub("^\"" name "\":\"", "", m); sub("\"$", "", m); return m } return "" }
	/"Action":"(run|pass|fail|skip)"/ {
		t = field("Test"); if (t == "" || index(t, "/")) next
		p = field("Package"); sub(/^github.com\/vpcip\/vpcip\//, "", p)
		k = p " " t
		if ($0 ~ /"Action":"run"/) live[k] = 1; else delete live[k]
	}
	END { for (k in live) print "    " k }' "$1" | sort
}

start=$SECONDS
# The loop's sleep runs in the background and is killed with the loop: a
# sleep left running holds the pipe to the caller's tee open, and make test
# waited up to two minutes after the last test for it.
(
	trap 'kill "$nap" 2>/dev/null; exit 0' TERM
	while :; do
		sleep "${VPCIP_TEST_BEAT:-120}" &
		nap=$!
		wait "$nap" || exit 0
		now=$(running "$json")
		[ -n "$now" ] || continue
		printf 'tests: %d min so far; still running:\n%s\n' $(((SECONDS - start) / 60)) "$now"
	done
) &
beat=$!
trap 'kill $beat 2>/dev/null' EXIT

"$gotestsum" --format pkgname-and-test-fails --format-icons text --jsonfile "$json" -- "$@"
