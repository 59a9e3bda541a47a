#!/bin/bash
# --resume refuses what would mix two configurations: a complete results
# file (HDF5, JSON Lines) or a killed run's journal made with another
# --dtype, --kv-cache-dtype, --cpu-gemm, backend, tokenizer or model
# (regenerated at the same path) is refused with one line naming the field,
# both files left as they were; an identical tokenizer at another path is
# the same tokenizer. The journal is trusted only record by record (a
# changed byte is redone), journal names are exact and regular files only
# (a FIFO or a link to /dev/zero is refused at once), a second job on the
# same output is refused while the first runs, and --resume after a
# complete JSON Lines run does nothing.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
S260=$SHARED/models/stories260K
[ -f "$S260/stories260K.bin" ] || { echo "stories260K not found under $SHARED: skipped" >&2; exit 77; }
CRASH=$BUILD/tests/dcpinfer-crash
cp "$S260/stories260K.bin" "$S260/tok512.bin" "$WORK/"
M="--model $WORK/stories260K.bin --tokenizer $WORK/tok512.bin"
P=$WORK/p.jsonl
for i in $(seq 0 15); do
    echo "{\"id\": \"q$i\", \"prompt\": \"Once upon a time $i\", \"max_tokens\": $((10 + i * 2)), \"temperature\": 0.9, \"seed\": $i}"
done >"$P"
vals() { h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p'; }
sums() { cat "$@" 2>/dev/null | md5sum; }

# a complete file, a JSON Lines one, and a killed run's journal, all fp32
NP=1 run_dcp full $M --dtype float32 --output "$WORK/full.h5" "$P"
NP=1 run_dcp fulljsonl $M --dtype float32 --output "$WORK/full.jsonl" "$P"
killed() { # OUT ARGS...: a run killed after its 4th journal record
    local out=$1; shift
    DCP_CRASH_AT=appended DCP_CRASH_COUNT=4 timeout 120 "$MPIRUN" -q -np 1 "$CRASH" "$@" --output "$out" "$P" >/dev/null 2>&1
}
killed "$WORK/k.h5" $M --dtype float32

# OPTION... TEXT: refused on the complete file, the JSONL file and the journal, files untouched
refused() {
    local name=$1 text=$2; shift 2
    local before
    before=$(sums "$WORK/full.h5" "$WORK/full.jsonl" "$WORK/full.jsonl.run.json" "$WORK"/k.h5.journal*)
    expect_error "$name-complete" 1 "$text" "$@" --resume --output "$WORK/full.h5" "$P"
    expect_error "$name-jsonl" 1 "$text" "$@" --resume --output "$WORK/full.jsonl" "$P"
    expect_error "$name-journal" 1 "$text" "$@" --resume --output "$WORK/k.h5" "$P"
    checks=$((checks + 1))
    if [ "$before" = "$(sums "$WORK/full.h5" "$WORK/full.jsonl" "$WORK/full.jsonl.run.json" "$WORK"/k.h5.journal*)" ]; then
        pass "$name: results, identity and journal files unchanged"
    else
        fail "$name: a refused --resume changed the files"
    fi
}
refused dtype 'another --dtype (resolved): "float32" there, "bfloat16" in this run' $M --dtype bfloat16
refused kv_dtype 'another --kv-cache-dtype: "float32" there, "bfloat16" in this run' $M --kv-cache-dtype bfloat16
refused cpu_gemm 'another --cpu-gemm: "invariant" there, "openblas" in this run' $M --dtype float32 --cpu-gemm openblas
refused seed 'another --seed: "0" there, "7" in this run' $M --dtype float32 --seed 7
# a tokenizer that differs in one piece's bytes
cp "$WORK/tok512.bin" "$WORK/tok512b.bin"
printf 'X' | dd of="$WORK/tok512b.bin" bs=1 seek=2000 conv=notrunc 2>/dev/null
refused tokenizer 'another tokenizer (its files' --model "$WORK/stories260K.bin" --tokenizer "$WORK/tok512b.bin" --dtype float32
# the same tokenizer at another path is the same tokenizer
mkdir -p "$WORK/elsewhere" && cp "$WORK/tok512.bin" "$WORK/elsewhere/"
NP=1 run_dcp same_tok --model "$WORK/stories260K.bin" --tokenizer "$WORK/elsewhere/tok512.bin" --dtype float32 \
    --resume --output "$WORK/full.h5" "$P"
checks=$((checks + 1))
if [ "$(cat "$WORK/same_tok.rc")" = 0 ] && grep -q "already the complete result" "$WORK/same_tok.out"; then
    pass "an identical tokenizer at another path: the complete file is the result of these inputs"
else
    fail "identical tokenizer elsewhere: exit $(cat "$WORK/same_tok.rc")"; cat "$WORK/same_tok.err" >&2
fi
# the backend: a CPU-only build runs one, so the stored identity is made
# to name another (the identity lines carry no checksum)
sed -i 's/"backend":"cpu"/"backend":"cuda"/' "$WORK/full.jsonl.run.json" "$WORK"/k.h5.journal.dp0
expect_error backend-jsonl 1 'another --backend: "cuda" there, "cpu" in this run' $M --dtype float32 --resume \
    --output "$WORK/full.jsonl" "$P"
expect_error backend-journal 1 'another --backend: "cuda" there, "cpu" in this run' $M --dtype float32 --resume \
    --output "$WORK/k.h5" "$P"
sed -i 's/"backend":"cuda"/"backend":"cpu"/' "$WORK/full.jsonl.run.json" "$WORK"/k.h5.journal.dp0

# --resume after a complete JSON Lines run does nothing
before=$(sums "$WORK/full.jsonl")
NP=1 run_dcp jsonl_done $M --dtype float32 --resume --output "$WORK/full.jsonl" "$P"
checks=$((checks + 1))
if grep -q "already the complete result" "$WORK/jsonl_done.out" && [ "$before" = "$(sums "$WORK/full.jsonl")" ]; then
    pass "--resume after a complete JSON Lines run: nothing to do, file untouched"
else
    fail "--resume after a complete JSONL run: $(head -3 "$WORK/jsonl_done.out")"
fi

# weights regenerated at the same path (another seed) are another model
"$MKMODEL" --out "$WORK/gen" --layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 --vocab 512 --seed 1 >/dev/null
G="--model $WORK/gen --tokenizer $WORK/tok512.bin"
killed "$WORK/g.h5" $G
rm -rf "$WORK/gen"
"$MKMODEL" --out "$WORK/gen" --layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 --vocab 512 --seed 2 >/dev/null
expect_error regenerated 1 "was written with another model (its files' contents)" $G \
    --resume --output "$WORK/g.h5" "$P"
# the same for a llama2.c file rewritten in place, one weight changed
killed "$WORK/l.h5" $M
printf '\001' | dd of="$WORK/stories260K.bin" bs=1 seek=300000 conv=notrunc 2>/dev/null
expect_error rewritten_bin 1 "was written with another model" $M --resume --output "$WORK/l.h5" "$P"
cp "$S260/stories260K.bin" "$WORK/"

# records that fail their checks are redone, never copied
killed "$WORK/t.h5" $M --dtype float32
j=$WORK/t.h5.journal.dp0
sed -i '2s/"tokens":\[\([0-9]*\)/"tokens":[1\1/' "$j"                       # a token digit
sed -i '3s/"text":"\(.\)/"text":"\1x/' "$j"                                 # a text byte
tail -1 "$j" >>"$j"                                                          # a duplicate
echo '{"sum":"0000000000000000","i":9,"line":10,"id":"q9","tokens":[1]}' >>"$j" # a fake record
NP=1 run_dcp tampered $M --dtype float32 --resume --output "$WORK/t.h5" "$P"
checks=$((checks + 1))
same=1
for d in output_tokens text; do [ "$(vals "$WORK/t.h5" /requests/$d)" = "$(vals "$WORK/full.h5" /requests/$d)" ] || same=0; done
if [ "$(cat "$WORK/tampered.rc")" = 0 ] && [ $same = 1 ] &&
    grep -q "# --resume: 3 journal record(s) failed their checks and their requests run again; the first: .*t.h5.journal.dp0:2: its checksum does not hold" "$WORK/tampered.out" &&
    grep -q "# resumed: 2 of 16 request(s)" "$WORK/tampered.out"; then
    pass "a changed digit, a changed text byte and a fake record are dropped and redone, a duplicate taken once: results equal the uninterrupted run's"
else
    fail "tampered journal: exit $(cat "$WORK/tampered.rc"), same results $same"; grep "resume" "$WORK/tampered.out" >&2
fi

# journal files are regular files of exact names: a FIFO or a link to
# /dev/zero is refused at once, not read
killed "$WORK/f.h5" $M --dtype float32
mkfifo "$WORK/f.h5.journal.dp1"
LIMIT=30 expect_error fifo_journal 1 "f.h5.journal.dp1: not a regular file (a FIFO)" $M --dtype float32 --resume \
    --output "$WORK/f.h5" "$P"
rm "$WORK/f.h5.journal.dp1"
ln -s /dev/zero "$WORK/f.h5.journal.dp1"
LIMIT=30 expect_error zero_journal 1 "f.h5.journal.dp1: a symbolic link" $M --dtype float32 --resume \
    --output "$WORK/f.h5" "$P"
rm "$WORK/f.h5.journal.dp1"

# a second job on the same output is refused while the first runs (it
# stops itself after its first journal record, holding the lock, until
# SIGCONT); the first's results are its own
DCP_CRASH_AT=appended DCP_CRASH_SIGNAL=STOP timeout 300 "$MPIRUN" -q -np 1 "$CRASH" $M --max-num-seqs 1 \
    --output "$WORK/two.h5" "$P" >"$WORK/first.out" 2>&1 &
first=$!
victim=
for i in $(seq 1000); do
    victim=$(pgrep -f "^$CRASH .*--output $WORK/two.h5" | tail -1)
    [ -n "$victim" ] && [ "$(ps -o stat= -p "$victim" | cut -c1)" = T ] && break
    sleep 0.02
done
expect_error second_job 1 "two.h5: another dcpinfer job is writing this output (host " $M --output "$WORK/two.h5" "$P"
kill -CONT "$victim" 2>/dev/null
wait $first
rc=$?
checks=$((checks + 1))
if [ $rc = 0 ] && grep -q "results written" "$WORK/first.out" && [ -z "$(ls "$WORK"/two.h5.journal* 2>/dev/null)" ] &&
    [ ! -e "$WORK/two.h5.lock" ] && [ "$(vals "$WORK/two.h5" /requests/output_tokens)" = "$(vals "$WORK/full.h5" /requests/output_tokens)" ]; then
    pass "the first job ends with its own results; its journal and lock are removed"
else
    fail "the first job: exit $rc: $(tail -2 "$WORK/first.out")"
fi
finish
