#!/bin/sh
# dcpinfer runs under mpirun -np 1 and as a plain executable; with
# stories260K both give llama2.c run.c's greedy story, token for token
# (REFERENCE-llama2c.txt, case 1) and text for text.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

P=$WORK/p.jsonl
cat >"$P" <<'JSON'
{"id": "x", "prompt_token_ids": [10, 20, 30], "max_tokens": 12, "temperature": 0}
{"id": "y", "prompt_token_ids": [7], "max_tokens": 5, "seed": 42}
JSON

# the default model: both ways of starting work and write a results file
checks=$((checks + 1))
run_dcp mpi --output "$WORK/mpi.h5" "$P"
OMPI_MCA_ess_singleton_isolated=1 "$DCPINFER" --output "$WORK/plain.h5" "$P" >"$WORK/plain.out" 2>"$WORK/plain.err"
plain_rc=$?
if [ "$(cat "$WORK/mpi.rc")" = 0 ] && [ "$plain_rc" = 0 ] && [ -f "$WORK/mpi.h5" ] && [ -f "$WORK/plain.h5" ]; then
    pass "mpirun and plain runs succeed"
else
    fail "runs: mpirun rc $(cat "$WORK/mpi.rc"), plain rc $plain_rc"; cat "$WORK/mpi.err" "$WORK/plain.err" >&2
fi

# --help documents every option
checks=$((checks + 1))
"$DCPINFER" --help >"$WORK/help" 2>&1
missing=
for opt in --model --tokenizer --max-tokens --temperature --top-p --seed --max-model-len --output --backend \
    --cpu-gemm --cpu-isa --max-num-seqs --max-num-batched-tokens --skip-invalid --progress --quiet --dtype --kv-cache-dtype; do
    grep -q -- "$opt" "$WORK/help" || missing="$missing $opt"
done
if [ -z "$missing" ]; then pass "--help documents every option"; else fail "--help lacks:$missing"; fi

# --quiet does what --help says: only the closing summary on stdout
checks=$((checks + 1))
run_dcp quiet --quiet --output "$WORK/quiet.h5" "$P"
if grep -q -- '--quiet  *only the closing summary on stdout: no start-up header' "$WORK/help" &&
    [ "$(cat "$WORK/quiet.rc")" = 0 ] && ! grep -qE '^# (dcpinfer |layout|KV cache|weights)' "$WORK/quiet.out" &&
    grep -q '^# [0-9]* request(s), 0 failed' "$WORK/quiet.out"; then
    pass "--quiet: the summary only, as --help says"
else
    fail "--quiet: exit $(cat "$WORK/quiet.rc"): $(head -3 "$WORK/quiet.out")"
fi

# --kv-cache-dtype bfloat16 and fp8: the same memory holds twice and four
# times the positions, and the KV bytes reported are 2 and 1 bytes per
# element: the default model has 4 layers, 2 KV heads of 16, so K and V
# take 4 x 2 x 32 x 2 bytes = 512 per position in bf16 (1024 in fp32, 256
# in fp8); x and y hold 3 + 12 and 1 + 5 positions, whose 16-position
# blocks are written as far as the tokens go
checks=$((checks + 1))
for kv in float32 bfloat16 fp8; do
    run_dcp kv$kv --kv-cache-memory 1M --kv-cache-dtype $kv --output "$WORK/kv$kv.h5" "$P"
done
size32=$(sed -n 's/^# KV cache size: \([0-9]*\) tokens.*/\1/p' "$WORK/kvfloat32.out")
size16=$(sed -n 's/^# KV cache size: \([0-9]*\) tokens.*/\1/p' "$WORK/kvbfloat16.out")
size8=$(sed -n 's/^# KV cache size: \([0-9]*\) tokens.*/\1/p' "$WORK/kvfp8.out")
peak32=$(h5dump -d /memory/kv_bytes_peak "$WORK/kvfloat32.h5" 2>/dev/null | sed -n 's/.*(0): *//p')
peak16=$(h5dump -d /memory/kv_bytes_peak "$WORK/kvbfloat16.h5" 2>/dev/null | sed -n 's/.*(0): *//p')
peak8=$(h5dump -d /memory/kv_bytes_peak "$WORK/kvfp8.h5" 2>/dev/null | sed -n 's/.*(0): *//p')
if [ -n "$size32" ] && [ "$size16" = $((2 * size32)) ] && [ -n "$peak32" ] && [ "$peak16" = $((peak32 / 2)) ] &&
    [ $((peak32 % 1024)) = 0 ]; then
    pass "bf16 KV cache: $size16 positions in 1M (fp32 $size32), peak $peak16 bytes (fp32 $peak32)"
else
    fail "bf16 KV cache: positions $size16 vs $size32, peak bytes $peak16 vs $peak32"
fi
checks=$((checks + 1))
if [ -n "$size16" ] && [ "$size8" = $((2 * size16)) ] && [ -n "$peak16" ] && [ "$peak8" = $((peak16 / 2)) ] &&
    h5dump -A "$WORK/kvfp8.h5" 2>/dev/null | grep -q '"kv_cache_dtype":"fp8-e4m3"'; then
    pass "fp8 KV cache: $size8 positions in 1M (bf16 $size16), peak $peak8 bytes (bf16 $peak16)"
else
    fail "fp8 KV cache: positions $size8 vs $size16, peak bytes $peak8 vs $peak16"
fi
# --kv-cache-dtype auto is the checkpoint's dtype, as vLLM's: a bf16
# checkpoint (torch_dtype bfloat16) gets a bf16 cache, twice the positions
# of the float32 one in the same memory; the default model, fp32, float32
"$MKMODEL" --out "$WORK/b16" --layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 96 --vocab 512 --dtype bf16 >/dev/null
for kv in auto float32; do
    run_dcp b16$kv --model "$WORK/b16" --kv-cache-memory 1M --kv-cache-dtype $kv --output "$WORK/b16$kv.h5" "$P"
done
run_dcp kvauto --kv-cache-memory 1M --output "$WORK/kvauto.h5" "$P"
checks=$((checks + 1))
auto16=$(sed -n 's/^# KV cache size: \([0-9]*\) tokens.*/\1/p' "$WORK/b16auto.out")
auto32=$(sed -n 's/^# KV cache size: \([0-9]*\) tokens.*/\1/p' "$WORK/b16float32.out")
if [ -n "$auto32" ] && [ "$auto16" = $((2 * auto32)) ] &&
    h5dump -A "$WORK/b16auto.h5" 2>/dev/null | grep -q '"kv_cache_dtype":"bfloat16"' &&
    h5dump -A "$WORK/kvauto.h5" 2>/dev/null | grep -q '"kv_cache_dtype":"float32"'; then
    pass "--kv-cache-dtype auto on a bf16 checkpoint: bfloat16, $auto16 positions in 1M (float32: $auto32)"
else
    fail "--kv-cache-dtype auto on a bf16 checkpoint: $auto16 positions in 1M, float32 $auto32"; cat "$WORK/b16auto.err" >&2
fi

# --cpu-isa: every instruction set this CPU has gives the portable
# kernels' bits (tokens, logprobs, prompt logprobs), fp32 and bf16
# weights, on a model whose K (520, 1030) takes the prefill's lane
# kernels, with a tail of K, and a 23-token prompt several 6-row tiles
"$MKMODEL" --out "$WORK/isa32" --layers 2 --dim 520 --heads 4 --kv-heads 2 --hidden 1030 --vocab 300 --seed 9 \
    --dtype f32 >/dev/null
"$MKMODEL" --out "$WORK/isa16" --layers 2 --dim 520 --heads 4 --kv-heads 2 --hidden 1030 --vocab 300 --seed 9 \
    --dtype bf16 >/dev/null
printf '{"id": "i", "prompt_token_ids": [%s], "max_tokens": 8, "temperature": 0, "logprobs": 2, "prompt_logprobs": 1}\n' \
    "$(seq -s ', ' 3 25)" >"$WORK/isa.jsonl"
results() {
    for d in output_tokens output_logprobs output_top_ids output_top_logprobs prompt_logprobs; do
        h5dump -d /requests/$d "$1" 2>/dev/null | tail -n +3
    done
}
for m in isa32 isa16; do
    run_dcp $m.generic --model "$WORK/$m" --cpu-isa generic --output "$WORK/$m.generic.h5" "$WORK/isa.jsonl"
    results "$WORK/$m.generic.h5" >"$WORK/$m.generic.txt"
    for isa in avx2 avx512; do
        checks=$((checks + 1))
        run_dcp $m.$isa --model "$WORK/$m" --cpu-isa $isa --output "$WORK/$m.$isa.h5" "$WORK/isa.jsonl"
        results "$WORK/$m.$isa.h5" >"$WORK/$m.$isa.txt"
        if grep -q "this CPU does not have it" "$WORK/$m.$isa.err"; then
            pass "$m: no $isa on this CPU, skipped"
        elif [ "$(cat "$WORK/$m.$isa.rc")" = 0 ] && [ "$(wc -l <"$WORK/$m.generic.txt")" -gt 20 ] &&
            cmp -s "$WORK/$m.generic.txt" "$WORK/$m.$isa.txt" &&
            h5dump -a /cpu_kernels "$WORK/$m.$isa.h5" | grep -q "\"$isa\"" &&
            h5dump -a /cpu_kernels "$WORK/$m.generic.h5" | grep -q '"generic"' &&
            grep -q "backend cpu (CPU kernels $isa)" "$WORK/$m.$isa.out"; then
            pass "$m: --cpu-isa $isa gives the portable kernels' tokens and logprobs (and says which kernels ran)"
        else
            fail "$m: --cpu-isa $isa differs from generic (rc $(cat "$WORK/$m.$isa.rc"))"
            diff "$WORK/$m.generic.txt" "$WORK/$m.$isa.txt" | head >&2
        fi
    done
done

# stories260K with a text prompt: the greedy story of llama2.c's run.c
model=$SHARED/models/stories260K
if [ ! -f "$model/stories260K.bin" ]; then
    echo "stories260K not found under $SHARED: its checks skipped" >&2
    finish
fi
# run.c's 65 ids: BOS, the 4 prompt tokens, then the 60 it generated
want=$(sed -n '/^CASE 1:/,/^CASE 2:/p' "$model/REFERENCE-llama2c.txt" | sed -n '/full token sequence/,/stdout between/p' |
    grep -E '^ +[0-9]' | tr -s ' \n' '\n' | grep . | tail -n +6 | tr '\n' ' ')
printf '{"id": "story", "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}\n' >"$P"
run_dcp story --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" --output "$WORK/s.h5" "$P"
OMPI_MCA_ess_singleton_isolated=1 "$DCPINFER" --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" \
    --output "$WORK/s-plain.h5" "$P" >"$WORK/story-plain.out" 2>&1
for f in s s-plain; do
    checks=$((checks + 1))
    got=$(h5dump -y -d /requests/output_tokens "$WORK/$f.h5" 2>/dev/null | sed -n '/DATA {/,/}/p' |
        tr -c '0-9\n' ' ' | tr -s ' \n' '\n' | grep . | tr '\n' ' ')
    if [ "$(echo "$want" | wc -w)" = 60 ] && [ "$got" = "$want" ]; then
        pass "$f: the 60 tokens of run.c's case 1"
    else
        fail "$f: tokens '$got', run.c gives '$want'"
    fi
done
checks=$((checks + 1))
if grep -q '^  story .* 5 .* 60 length .*", there was a little girl named Lily. She loved' "$WORK/story.out"; then
    pass "stories260K text"
else
    fail "stories260K text:"; cat "$WORK/story.out" "$WORK/story.err" >&2
fi
finish
