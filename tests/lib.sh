# Shared by the shell tests: paths, a scratch folder, counted checks.
# Each test sources this, calls its checks, then `finish`.
set -u
BUILD=${DCP_BUILDDIR:-$(pwd)}
SRC=${DCP_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
SHARED=${DCP_SHARED:-$SRC/../shared}
MPIRUN=${MPIRUN:-mpirun}
DCPINFER=$BUILD/dcpinfer
MKMODEL=$BUILD/dcpinfer-mkmodel
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dcptest.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0
checks=0

fail() { failures=$((failures + 1)); echo "FAIL: $*" >&2; }
pass() { echo "ok: $*" >&2; }

# run_dcp NAME ARGS...: runs dcpinfer under mpirun -np ${NP:-1}, for at most
# ${LIMIT:-300} seconds; stdout, stderr and the exit status land in
# $WORK/NAME.{out,err,rc}
run_dcp() {
    local name=$1; shift
    timeout "${LIMIT:-300}" "$MPIRUN" -q --oversubscribe --bind-to none -np "${NP:-1}" "$DCPINFER" "$@" \
        >"$WORK/$name.out" 2>"$WORK/$name.err"
    echo $? >"$WORK/$name.rc"
}

# expect_error NAME STATUS TEXT ARGS...: dcpinfer exits with STATUS and its
# stderr is exactly one line, containing TEXT
expect_error() {
    local name=$1 status=$2 text=$3; shift 3
    checks=$((checks + 1))
    run_dcp "$name" "$@"
    local rc lines
    rc=$(cat "$WORK/$name.rc")
    lines=$(grep -c '' "$WORK/$name.err")
    if [ "$rc" != "$status" ]; then
        fail "$name: exit status $rc, expected $status"; sed 's/^/    /' "$WORK/$name.err" >&2
    elif [ "$lines" != 1 ]; then
        fail "$name: $lines lines on stderr, expected one"; sed 's/^/    /' "$WORK/$name.err" >&2
    elif ! grep -qF -- "$text" "$WORK/$name.err"; then
        fail "$name: stderr lacks '$text':"; sed 's/^/    /' "$WORK/$name.err" >&2
    else
        pass "$name: $(cat "$WORK/$name.err")"
    fi
}

# M: stories260K and its tokenizer when $SHARED has them; else empty (the
# generated model), and story_prompt gives token ids instead of text
stories_or_generated() {
    local model=$SHARED/models/stories260K
    if [ -f "$model/stories260K.bin" ]; then
        M="--model $model/stories260K.bin --tokenizer $model/tok512.bin"
    else
        echo "stories260K not found under $SHARED: using the generated model with token prompts" >&2
        M=""
    fi
}
story_prompt() { # I: the prompt field of request I
    if [ -n "$M" ]; then echo "\"prompt\": \"Once upon a time $1\""; else echo "\"prompt_token_ids\": [$(($1 + 1)), 7]"; fi
}

# prompts FILE: each request's prompt ids in an HDF5 result, comma-joined,
# one line each (needs h5dump)
prompts() { # FILE: each request's prompt ids, comma-joined, one line each
    off=$(h5dump -y -d /requests/prompt_offsets "$1" | sed -n '/DATA {/,/}/p' | tr -c '0-9\n' ' ' | tr -s ' \n' '\n' | grep .)
    ids=$(h5dump -y -d /requests/prompt_tokens "$1" | sed -n '/DATA {/,/}/p' | tr -c '0-9\n' ' ' | tr -s ' \n' '\n' | grep . | tr '\n' ' ')
    echo "$off" | awk -v ids="$ids" 'BEGIN {n = split(ids, t, " ")} NR > 1 {s = ""; for (i = prev + 1; i <= $1; i++) s = s (s ? "," : "") t[i]; print s} {prev = $1}'
}

# id_list FILE: a reference's ids (tests/data/*/prompt.txt, greedy.txt),
# comma-joined
id_list() { tr -s ' \n' ',' <"$1" | sed 's/,$//'; }
# untimed FILE: a JSON Lines result without its timings, for comparing runs
untimed() { sed -E 's/"(ttft_s|tpot_s|e2e_s)": *[-0-9.e+]*,? *//g' "$1"; }
# unspec FILE: untimed, less the speculation counts (a run with drafts
# against one without)
unspec() { untimed "$1" | sed -E 's/,"spec_(draft|accepted)_tokens":[0-9]+//g'; }
# token_ids FILE ID: the token ids of request ID in a JSON Lines result
token_ids() { grep "\"id\":\"$2\"" "$1" | grep -o '"token_ids":\[[^]]*\]' | sed 's/.*\[//; s/\]//'; }

# h5_numbers FILE DATASET: a numeric dataset's values, one per line (h5dump)
h5_numbers() {
    h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr -c '0-9.eE+\n-' ' ' | tr -s ' \n' '\n' | grep .
}
# h5_sum FILE DATASET: the sum of a numeric dataset
h5_sum() { h5_numbers "$1" "$2" | awk '{s += $1} END {print s + 0}'; }

finish() {
    if [ "$failures" -gt 0 ]; then
        echo "$(basename "$0"): $failures of $checks checks failed" >&2
        exit 1
    fi
    echo "$(basename "$0"): all $checks checks passed" >&2
    exit 0
}
