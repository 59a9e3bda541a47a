#!/bin/sh
# A failing MPI call in the result transfer, the rank-map gather or the
# topology set-up is reported with rank, file, line and the call, and ends
# the job with exit status 3 and no results file (before, the return codes
# were ignored and a run could write results it never gathered).
# tests/dcpinfer-mpifault is
# dcpinfer with the calls named by DCP_FAIL_MPI failing (tests/pmpi_fault.c).
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
DCPINFER=$BUILD/tests/dcpinfer-mpifault
P=$WORK/p.jsonl
printf '{"id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 3}\n{"id": "b", "prompt_token_ids": [1, 2], "max_tokens": 3}\n' >"$P"
# two DP groups: the second group's leader sends its results to rank 0
for case in "MPI_Send src/parallel/transfer.c" "MPI_Comm_split src/parallel/topology.c" "MPI_Gather src/app/job.c"; do
    set -- $case
    checks=$((checks + 1))
    export DCP_FAIL_MPI=$1 NP=2 LIMIT=60
    run_dcp "$1" -dp 2 --output "$WORK/$1.h5" "$P"
    rc=$(cat "$WORK/$1.rc")
    if [ "$rc" = 3 ] && grep -q "^dcpinfer: rank [01]: .*$2:[0-9]*: DCP_CHECK\|^dcpinfer: rank [01]: .*$2:[0-9]*: $1(" "$WORK/$1.err" &&
        [ ! -e "$WORK/$1.h5" ]; then
        pass "$1 failing: $(grep -m1 '^dcpinfer: rank' "$WORK/$1.err")"
    else
        fail "$1 failing: exit $rc"; sed 's/^/    /' "$WORK/$1.err" | head -5 >&2
    fi
done
finish
