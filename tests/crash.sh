#!/bin/bash
# A crash at each point of writing the journal and the results loses no
# finished request and duplicates none. tests/dcpinfer-crash kills itself
# (SIGKILL, as a crash or a lost node) at a named point (tests/crash_points.c):
# first a run after its 5th journal record, then a --resume of it at each
# point of consolidating the journal and of writing the results (HDF5 and
# JSON Lines). A plain --resume afterwards must give the results of an
# uninterrupted run, taking each journaled request once.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
CRASH=$BUILD/tests/dcpinfer-crash
stories_or_generated
P=$WORK/p.jsonl
for i in $(seq 0 11); do
    t=$([ $((i % 2)) = 0 ] && echo 0.8 || echo 0)
    prompt=$(story_prompt $i)
    echo "{\"id\": \"q$i\", $prompt, \"max_tokens\": $((8 + i * 3)), \"temperature\": $t, \"seed\": $i}"
done >"$P"
vals() { h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p'; }
attr() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/.*(0): *//p'; }
# distinct requests in the journal files of an output
journaled() { cat "$1".journal "$1".journal.dp[0-9]* 2>/dev/null | grep -o '"i":[0-9]*' | sort -u | wc -l; }
ARGS="$M --max-num-seqs 2"
NP=1 run_dcp full $ARGS --output "$WORK/full.h5" "$P"
NP=1 run_dcp fulljsonl $ARGS --output "$WORK/full.jsonl" "$P"

# a run killed after its 5th journal record: the state every case starts from
killed_run() {
    rm -f "$1" "$1".*
    DCP_CRASH_AT=appended DCP_CRASH_COUNT=5 timeout 120 "$MPIRUN" -q -np 1 "$CRASH" $ARGS --output "$1" "$P" \
        >/dev/null 2>&1
}

check_case() { # NAME OUT FULL: after the crash, a plain --resume completes the results
    local name=$1 out=$2 full=$3 before
    before=$(journaled "$out")
    NP=1 run_dcp "$name-resume" $ARGS --resume --output "$out" "$P"
    checks=$((checks + 1))
    local rc resumed
    rc=$(cat "$WORK/$name-resume.rc")
    if [ "$rc" != 0 ]; then
        fail "$name: the --resume after the crash exited $rc"; cat "$WORK/$name-resume.err" >&2
        return
    fi
    if [ "${out##*.}" = jsonl ]; then
        if cmp -s <(sed 's/"metrics":{[^}]*}//; s/"created":[0-9]*//' "$out") \
            <(sed 's/"metrics":{[^}]*}//; s/"created":[0-9]*//' "$full") && [ -z "$(ls "$out".journal* "$out".*tmp* 2>/dev/null)" ]; then
            pass "$name: results equal the uninterrupted run's ($before requests were journaled), journal gone"
        else
            fail "$name: JSONL results differ from the uninterrupted run's, or journals left: $(ls "$out".journal* 2>/dev/null)"
        fi
        return
    fi
    resumed=$(attr "$out" /resumed_requests)
    local same=1
    for d in output_tokens output_offsets text finish_reason; do
        [ "$(vals "$out" /requests/$d)" = "$(vals "$full" /requests/$d)" ] || { same=0; echo "$name: /requests/$d differs" >&2; }
    done
    if grep -q "already the complete result" "$WORK/$name-resume.out"; then resumed=complete; fi
    if [ $same = 1 ] && { [ "$resumed" = "$before" ] || [ "$resumed" = complete ]; } &&
        [ -z "$(ls "$out".journal* "$out".*tmp* 2>/dev/null)" ]; then
        pass "$name: results equal the uninterrupted run's; resumed $resumed of the $before journaled requests, journal gone"
    else
        fail "$name: same=$same, resumed '$resumed' of $before journaled; journals left: $(ls "$out".journal* 2>/dev/null)"
    fi
}

checks=$((checks + 1))
killed_run "$WORK/k.h5"
if [ "$(journaled "$WORK/k.h5")" = 5 ] && [ ! -e "$WORK/k.h5" ]; then
    pass "killed after its 5th journal record: 5 requests journaled, no results"
else
    fail "the killed run left $(journaled "$WORK/k.h5") journaled requests, results $([ -e "$WORK/k.h5" ] && echo present || echo absent)"
fi

# POINT FILE EXT: a resumed run killed at POINT of writing the file whose
# path ends in FILE (%: the output's name), the output HDF5 or JSON Lines
k=0
for point in "written .journal h5" "renamed .journal h5" "removed .journal.dp0 h5" "written % h5" "renamed % h5" \
    "removed .journal h5" "written % jsonl" "renamed % jsonl" "written .run.json jsonl" "renamed .run.json jsonl"; do
    k=$((k + 1))
    read -r at file ext <<<"$point"
    out=$WORK/c$k.$ext
    file=${file/\%/c$k.$ext}
    killed_run "$out"
    DCP_CRASH_AT=$at DCP_CRASH_PATH=$file timeout 120 "$MPIRUN" -q -np 1 "$CRASH" $ARGS --resume --output "$out" "$P" \
        >"$WORK/c$k.crash.out" 2>&1
    rc=$?
    checks=$((checks + 1))
    if [ $rc != 137 ]; then
        fail "crash at '$at' of $file: the run did not die there (exit $rc)"; cat "$WORK/c$k.crash.out" >&2
        continue
    fi
    pass "crash at '$at' of $file: killed; $(journaled "$out") requests in the journal files, results $([ -e "$out" ] && echo present || echo absent)"
    check_case "crash-$at-$file" "$out" "$WORK/full.$ext"
done
finish
