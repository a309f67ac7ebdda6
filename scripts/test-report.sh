#!/usr/bin/env bash
# test-report.sh PHASES TESTLOG: prints how long each phase of `make test`
# took (scripts/phase.sh wrote PHASES) and each test package's time from go
# test's output in TESTLOG, slowest first, with the total.
set -uo pipefail
phases=$1 log=$2
echo
echo "make test: time per phase"
awk -F'\t' '{t+=$2; printf "  %-34s %7.1f s  %s\n", $1, $2, ($3==0 ? "" : "exit " $3)} END{printf "  %-34s %7.1f s (%.1f min)\n", "total", t, t/60}' "$phases"
if [ -f "$log" ]; then
	echo "make test: time per test package (slowest first; packages run two at a time)"
	awk '($1=="ok" || $1=="FAIL") && $3 ~ /s$/ {sub(/s$/, "", $3); sub(/^github.com\/vpcip\/vpcip\//, "", $2); printf "  %-34s %7.1f s  %s\n", $2, $3, ($1=="ok" ? "" : "FAIL")}' "$log" | sort -k2 -rn
fi
