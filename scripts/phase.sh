#!/usr/bin/env bash
# phase.sh NAME CMD [ARG...]: runs CMD and appends "NAME<TAB>seconds<TAB>exit
# status" to the file $VPCIP_PHASES (nothing when unset); exits as CMD did.
# `make test` times each of its phases so, and scripts/test-report.sh prints
# them at the end.
set -uo pipefail
name=$1
shift
start=$(date +%s.%N)
"$@"
rc=$?
end=$(date +%s.%N)
if [ -n "${VPCIP_PHASES:-}" ]; then
	awk -v n="$name" -v s="$start" -v e="$end" -v rc="$rc" 'BEGIN{printf "%s\t%.1f\t%d\n", n, e-s, rc}' >>"$VPCIP_PHASES"
fi
exit $rc
