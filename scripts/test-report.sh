#!/usr/bin/env bash
# test-report.sh PHASES TESTJSON: prints how long each phase of `make test`
# took (scripts/phase.sh wrote PHASES), each test package's time and the
# tests that took a minute or more, from go test's JSON events in TESTJSON
# (scripts/run-tests.sh wrote it), slowest first, and the failed tests.
set -uo pipefail
phases=$1 json=$2
echo
echo "make test: time per phase"
# Phases named "beside: ..." ran at the same time as the tests (at the lowest
# priority) and are left out of the total.
awk -F'\t' '{printf "  %-44s %7.1f s  %s\n", $1, $2, ($3==0 ? "" : "exit " $3); if ($1 !~ /^beside: /) t+=$2}
	END{printf "  %-44s %7.1f s (%.1f min; the \"beside\" phases ran during the tests)\n", "total", t, t/60}' "$phases"
[ -s "$json" ] || exit 0
# field NAME: the string or number value of "NAME" in one JSON event line.
fields='function field(name,   m) { if (match($0, "\"" name "\":(\"[^\"]*\"|[0-9.]+)")) { m = substr($0, RSTART, RLENGTH); sub("^\"" name "\":", "", m); gsub("\"", "", m); return m } return "" }'
echo "make test: time per test package (slowest first; packages run two at a time)"
awk "$fields"'
/"Action":"(pass|fail)"/ && !/"Test":/ {
	p = field("Package"); sub(/^github.com\/vpcip\/vpcip\//, "", p)
	printf "  %-34s %7.1f s  %s\n", p, field("Elapsed"), ($0 ~ /"Action":"fail"/ ? "FAIL" : "")
}' "$json" | sort -k2 -rn
echo "make test: tests that took a minute or more"
awk "$fields"'
/"Action":"(pass|fail)"/ && /"Test":/ {
	t = field("Test"); if (index(t, "/") || field("Elapsed") + 0 < 60) next
	p = field("Package"); sub(/^github.com\/vpcip\/vpcip\//, "", p)
	printf "  %7.1f s  %s%s\n", field("Elapsed"), p "." t, ($0 ~ /"Action":"fail"/ ? "  FAIL" : "")
}' "$json" | sort -k1 -rn
failed=$(awk "$fields"'/"Action":"fail"/ && /"Test":/ { p = field("Package"); sub(/^github.com\/vpcip\/vpcip\//, "", p); print "  " p "." field("Test") }' "$json")
if [ -n "$failed" ]; then
	echo "make test: failed tests (their output is above and in results/make-test.log)"
	echo "$failed"
fi
