#!/bin/sh
# Each bad input stops dcpinfer with one clear line naming the place and
# the bad value; per-request problems fail that request alone.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

P=$WORK/p.jsonl
good='{"id": "g", "prompt_token_ids": [1, 2, 3], "max_tokens": 2}'

printf '%s\n{"id": "b", "prompt_token_ids": [1, 2\n' "$good" >"$P"
expect_error malformed_json 1 "p.jsonl:2: invalid JSON" --output "$WORK/o.h5" "$P"

printf '{"id": "a", "prompt_token_ids": "1 2 3"}\n' >"$P"
expect_error wrong_type 1 'p.jsonl:1: wrong field type: "prompt_token_ids" must be an array of integers' "$P"

printf '{"id": "a", "prompt": "x", "max_tokens": "ten"}\n' >"$P"
expect_error wrong_type_max_tokens 1 'p.jsonl:1: "max_tokens" must be an integer from 1 to 2147483647' "$P"
printf '{"id": "a", "prompt": "x", "max_tokens": 2147483648}\n' >"$P"
expect_error big_max_tokens 1 'p.jsonl:1: "max_tokens" must be an integer from 1 to 2147483647' "$P"
printf '{"id": "a", "prompt": "a\\u0000b"}\n' >"$P"
expect_error nul_in_string 1 'p.jsonl:1: a \u0000 (NUL) character in a string at column' "$P"
# stop_token_ids outside the vocabulary are refused, as logit_bias's
printf '{"id": "a", "prompt_token_ids": [1, 2], "stop_token_ids": [99999]}\n' >"$P"
expect_error stop_id_vocab 1 'p.jsonl:1: "stop_token_ids" names token 99999, outside the vocabulary [0, 512)' "$P"
printf '{"id": "a", "prompt_token_ids": [1, 2], "stop_token_ids": [-1]}\n' >"$P"
expect_error stop_id_negative 1 'p.jsonl:1: "stop_token_ids" names token -1, outside the vocabulary [0, 512)' "$P"

: >"$P"
expect_error empty_file 1 "p.jsonl: no requests (the prompt file is empty)" "$P"

expect_error missing_prompts 1 "$WORK/nope.jsonl: No such file or directory" "$WORK/nope.jsonl"

printf '%s\n' "$good" >"$P"
expect_error missing_model 1 "$WORK/no-model: model path does not exist" --model "$WORK/no-model" "$P"

# a checkpoint cut short: the header survives, the data does not
"$MKMODEL" --out "$WORK/m" --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 64 --vocab 64
cp -r "$WORK/m" "$WORK/trunc"
head -c 20000 "$WORK/m/model.safetensors" >"$WORK/trunc/model.safetensors"
expect_error truncated_safetensors 1 "out of range (data section is" --model "$WORK/trunc" "$P"
head -c 100 "$WORK/m/model.safetensors" >"$WORK/trunc/model.safetensors"
expect_error truncated_header 1 "exceeds the file size 100 (truncated file?)" --model "$WORK/trunc" "$P"

# a header whose offsets point past the data
hdr='{"model.embed_tokens.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,1600]}}'
len=${#hdr}
{
    printf "$(printf '\\%03o\\%03o' $((len % 256)) $((len / 256)))\\000\\000\\000\\000\\000\\000"
    printf '%s' "$hdr"
    head -c 16 /dev/zero
} >"$WORK/trunc/model.safetensors"
expect_error header_offsets 1 "tensor 'model.embed_tokens.weight': data_offsets [0, 1600] out of range (data section is 16 bytes" \
    --model "$WORK/trunc" "$P"

printf '%s\n{"id": "v", "prompt_token_ids": [1, 70000]}\n' "$good" >"$P"
expect_error token_outside_vocab 1 "p.jsonl:2: token id 70000 at position 1 is outside the vocabulary [0, 512)" "$P"

printf '%s\n' "$good" >"$P"
expect_error unknown_option 2 "unknown option '--max-tokenz'" --max-tokenz 3 "$P"
expect_error bad_option_value 2 "--temperature: '-1' is not a number" --temperature -1 "$P"
if nm "$DCPINFER" 2>/dev/null | grep -q cuda_count_launch; then
    expect_error no_gpu 2 "--backend cuda: no usable GPU" --backend cuda "$P"
else
    expect_error no_cuda 2 "--backend cuda: this dcpinfer was built without CUDA" --backend cuda "$P"
fi
expect_error dtype_unknown 2 "--dtype float16: choose auto, float32 or bfloat16" --dtype float16 "$P"
expect_error kv_dtype_unknown 2 "--kv-cache-dtype fp16: choose auto, float32, bfloat16 or fp8 (fp8_e4m3)" --kv-cache-dtype fp16 "$P"
expect_error cpu_isa_unknown 2 "--cpu-isa sse9: choose auto, generic, avx2 or avx512" --cpu-isa sse9 "$P"
grep -q avx512f /proc/cpuinfo ||
    expect_error cpu_isa_missing 2 "--cpu-isa avx512: this CPU does not have it (best: " --cpu-isa avx512 "$P"
expect_error bf16_openblas 2 "--dtype bfloat16: OpenBLAS has no bf16 GEMM (--cpu-gemm openblas)" --dtype bfloat16 \
    --cpu-gemm openblas "$P"
expect_error model_len_above_model 1 "--max-model-len 4096 exceeds the model's maximum of 2048" --max-model-len 4096 "$P"

# a prompt above the context limit fails alone; the others complete
printf '%s\n{"id": "long", "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n{"id": "h", "prompt_token_ids": [4], "max_tokens": 3}\n' "$good" >"$P"
expect_error prompt_too_long 4 'p.jsonl:2: request "long": prompt has 10 tokens, above the context limit of 8' \
    --max-model-len 8 --output "$WORK/long.h5" "$P"
checks=$((checks + 1))
if grep -q '^  g .* 2 length' "$WORK/prompt_too_long.out" && grep -q '^  long .* 0 error' "$WORK/prompt_too_long.out" &&
    grep -q '^  h .* 3 length' "$WORK/prompt_too_long.out" && grep -q '# 3 request(s), 1 failed, 5 output tokens' "$WORK/prompt_too_long.out"; then
    pass "prompt_too_long: the other requests completed"
else
    fail "prompt_too_long: summary:"; cat "$WORK/prompt_too_long.out" >&2
fi

# --skip-invalid records a bad line and goes on
printf '%s\nnot json at all\n' "$good" >"$P"
expect_error skip_invalid 4 "p.jsonl:2: invalid JSON" --skip-invalid --output "$WORK/skip.h5" "$P"
checks=$((checks + 1))
if grep -q '# 2 request(s), 1 failed, 2 output tokens' "$WORK/skip_invalid.out" && [ -f "$WORK/skip.h5" ]; then
    pass "skip_invalid: run completed"
else
    fail "skip_invalid: summary:"; cat "$WORK/skip_invalid.out" >&2
fi

# an output path that cannot be written stops the run before any work
# (the model path does not exist either: the output is checked first)
printf '%s\n' "$good" >"$P"
expect_error unwritable_output 1 "cannot create the output file" --output "$WORK/no/such/dir/o.h5" "$P"
mkdir -p "$WORK/outdir"
expect_error output_is_directory 1 "$WORK/outdir: --output names a directory" --output "$WORK/outdir" \
    --model "$WORK/no-model" "$P"

# every request failed: the results are written, and the exit status says so
printf '{"id": "t", "prompt": "text, but the default model has no tokenizer"}\n' >"$P"
expect_error all_failed_no_tokenizer 4 'request "t": text prompt, but the model has no tokenizer' \
    --output "$WORK/nt.h5" "$P"
checks=$((checks + 1))
if [ -f "$WORK/nt.h5" ] && grep -q '# 1 request(s), 1 failed' "$WORK/all_failed_no_tokenizer.out"; then
    pass "all_failed_no_tokenizer: results written"
else
    fail "all_failed_no_tokenizer: no results file or wrong summary"
fi
printf '{"id": "s", "prompt_token_ids": [1, 2], "stop": "end"}\n' >"$P"
expect_error stop_without_tokenizer 4 'request "s": "stop" strings need output text, but the model has no tokenizer' \
    --output "$WORK/st.h5" "$P"
printf '{"id": "m", "prompt_token_ids": [1, 2], "max_tokens": 4, "min_tokens": 5}\n' >"$P"
expect_error min_above_max 1 '"min_tokens" (5) is above "max_tokens" (4)' --output "$WORK/mm.h5" "$P"
printf '{"id": "l", "prompt_token_ids": [1, 2], "logprobs": 21}\n' >"$P"
expect_error logprobs_too_many 1 '"logprobs" must be an integer in [0, 20]' --output "$WORK/lp.h5" "$P"
printf '%s\n' "$good" >"$P"
expect_error kv_too_small 4 'need 1 KV blocks of 16 per rank, the cache has 0' --kv-cache-memory 1K --output "$WORK/kv.h5" "$P"

# the first steps a new user gets wrong, each named precisely
printf '%s\n' "$good" >"$P"
mkdir -p "$WORK/a-folder"
expect_error folder_as_prompts 1 "$WORK/a-folder: a folder, not a prompt file" "$WORK/a-folder"
expect_error max_tokens_huge 2 "--max-tokens: 99999999999999 is out of range: it takes 1 to 1073741824" \
    --max-tokens 99999999999999 "$P"
expect_error tp_one_rank 1 "-tp 2 needs 2 ranks (a multiple of 2), and this run has 1: start it with mpirun -np 2" \
    -tp 2 "$P"
mkdir -p "$WORK/l2c"
"$MKMODEL" --out "$WORK/l2c/tiny.bin" --format llama2c --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 64 --vocab 64 >/dev/null
expect_error llama2c_folder_as_model 1 "$WORK/l2c: a folder without config.json, so not a Hugging Face checkpoint; it holds the llama2.c checkpoint(s) tiny.bin: name the file, e.g. --model $WORK/l2c/tiny.bin" \
    --model "$WORK/l2c" "$P"
S260=$SHARED/models/stories260K
if [ -f "$S260/stories260K.bin" ] && [ -f "$SHARED/tokenizers/llama3/tokenizer.json" ]; then
    printf '{"id": "t", "prompt": "Once"}\n' >"$P"
    expect_error tokenizer_json_for_llama2c 1 "tokenizer.json: the tokenizer has ids up to 128255, the model's vocabulary only 512 (wrong tokenizer?)" \
        --model "$S260/stories260K.bin" --tokenizer "$SHARED/tokenizers/llama3/tokenizer.json" --output "$WORK/tj.h5" "$P"
fi

finish
