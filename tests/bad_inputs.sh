#!/bin/bash
# Inputs that fuzzing found to crash dcpinfer, to be read with a changed
# meaning, or to allocate without bound: each is refused with one line
# before any large allocation, or (a per-request problem) fails its request
# alone. Each case is a regression input for a defect that was fixed.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

P=$WORK/p.jsonl
good='{"id": "g", "prompt_token_ids": [1, 2, 3], "max_tokens": 2}'
printf '%s\n' "$good" >"$P"

# ---- model files -------------------------------------------------------
"$MKMODEL" --out "$WORK/hf" --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 64 --vocab 64 >/dev/null
"$MKMODEL" --out "$WORK/m.bin" --format llama2c --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 64 \
    --vocab 64 --max-len 32 >/dev/null
# a config.json integer above 2^31 used to run as its low 32 bits (16 here)
cp -r "$WORK/hf" "$WORK/big"
sed -i 's/"hidden_size": *32/"hidden_size": 4294967328/' "$WORK/big/config.json"
expect_error config_int_overflow 1 '"hidden_size" is 4294967328, out of range' --model "$WORK/big" "$P"
cp "$WORK/hf/config.json" "$WORK/big/config.json"
sed -i 's/"vocab_size": *64/"vocab_size": 1073741824/' "$WORK/big/config.json"
expect_error config_vocab_bound 1 'vocabulary is 1073741824; it must be from 1 to 16777216' --model "$WORK/big" "$P"
cp "$WORK/hf/config.json" "$WORK/big/config.json"
sed -i 's/"rms_norm_eps": *[-0-9.e]*/"rms_norm_eps": -1e-05/' "$WORK/big/config.json"
expect_error config_negative_eps 1 'rms_norm_eps -1e-05 must be a positive number' --model "$WORK/big" "$P"
cp "$WORK/hf/config.json" "$WORK/big/config.json"
sed -i 's/"rope_theta": *[-0-9.e]*/"rope_theta": 0/' "$WORK/big/config.json"
expect_error config_zero_theta 1 'rope_theta 0 must be a positive number' --model "$WORK/big" "$P"

# llama2.c header words: dim hidden layers heads kv_heads vocab seq_len
patch_header() { # FILE WORD VALUE: little-endian int32 at word WORD
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($3 & 255)) $((($3 >> 8) & 255)) $((($3 >> 16) & 255)) \
        $((($3 >> 24) & 255)))" | dd of="$1" bs=4 seek="$2" conv=notrunc status=none
}
cp "$WORK/m.bin" "$WORK/shrunk.bin"
patch_header "$WORK/shrunk.bin" 1 32
expect_error llama2c_shrunk_hidden 1 'need exactly' --model "$WORK/shrunk.bin" "$P"
cp "$WORK/m.bin" "$WORK/shrunk.bin"
patch_header "$WORK/shrunk.bin" 6 16
expect_error llama2c_shrunk_seq_len 1 'need exactly' --model "$WORK/shrunk.bin" "$P"
cp "$WORK/m.bin" "$WORK/shrunk.bin"
patch_header "$WORK/shrunk.bin" 5 $((0x80000000))
expect_error llama2c_vocab_int_min 1 'vocabulary is 0; it must be from 1' --model "$WORK/shrunk.bin" "$P"
cp "$WORK/hf/config.json" "$WORK/big/config.json"
sed -i 's/"head_dim": *8/"head_dim": 1073741824/' "$WORK/big/config.json"
expect_error config_head_dim_huge 1 'head_dim is 1073741824; it must be from 1 to 4096' --model "$WORK/big" "$P"
# a 28-byte file: a header and nothing else, whose size check used to wrap
head -c 28 "$WORK/m.bin" >"$WORK/h28.bin"
patch_header "$WORK/h28.bin" 0 $((1 << 30))
patch_header "$WORK/h28.bin" 3 1
expect_error llama2c_28_bytes 1 'hidden size (dim) is 1073741824' --model "$WORK/h28.bin" "$P"

# non-regular files would block (FIFO) or never end
mkfifo "$WORK/fifo.bin"
expect_error model_fifo 1 'fifo.bin: the model file is not a regular file (a FIFO)' --model "$WORK/fifo.bin" "$P"
mkdir -p "$WORK/fifohf"
cp "$WORK/hf/config.json" "$WORK/fifohf/"
mkfifo "$WORK/fifohf/model.safetensors"
expect_error shard_fifo 1 'the safetensors file is not a regular file (a FIFO)' --model "$WORK/fifohf" "$P"
expect_error tokenizer_fifo 1 'the tokenizer file is not a regular file (a FIFO)' --tokenizer "$WORK/fifo.bin" "$P"

# ---- the prompt file ----------------------------------------------------
printf '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": [1, 2], "max_token": 5}}\n' >"$WORK/oa.jsonl"
expect_error openai_unknown_body_field 1 'oa.jsonl:1: unknown field "max_token" in "body"' "$WORK/oa.jsonl"
printf '{"custom_id": "a", "methd": "POST", "body": {"prompt": [1, 2]}}\n' >"$WORK/oa.jsonl"
expect_error openai_unknown_line_field 1 'oa.jsonl:1: unknown field "methd" (OpenAI batch line)' "$WORK/oa.jsonl"
printf '{"id": "a", "prompt_token_ids": [1, 2]}\n{"id": "b",\000 "prompt_token_ids": [3]}\n' >"$WORK/nul.jsonl"
expect_error nul_byte 1 'nul.jsonl:2: a NUL byte at column 12' "$WORK/nul.jsonl"

# a top_p too small for a float keeps the most likely token (it became 0,
# "no top-p"); a temperature whose division overflows samples greedily
printf '{"id": "greedy", "prompt_token_ids": [5, 6, 7], "max_tokens": 12, "temperature": 0}
{"id": "tiny_top_p", "prompt_token_ids": [5, 6, 7], "max_tokens": 12, "temperature": 1.0, "top_p": 1e-50}
{"id": "tiny_temp", "prompt_token_ids": [5, 6, 7], "max_tokens": 12, "temperature": 1e-40}\n' >"$WORK/tiny.jsonl"
run_dcp tiny_sampling_values --output "$WORK/tiny.h5" "$WORK/tiny.jsonl"
checks=$((checks + 1))
g=$(grep '^  greedy ' "$WORK/tiny_sampling_values.out" | sed 's/.*\[/[/')
p=$(grep '^  tiny_top_p ' "$WORK/tiny_sampling_values.out" | sed 's/.*\[/[/')
t=$(grep '^  tiny_temp ' "$WORK/tiny_sampling_values.out" | sed 's/.*\[/[/')
if [ -n "$g" ] && [ "$g" = "$p" ] && [ "$g" = "$t" ]; then pass "tiny top_p and temperature give the greedy tokens $g"
else fail "greedy $g, top_p 1e-50 $p, temperature 1e-40 $t"; fi

# ---- options ------------------------------------------------------------
printf '%s\n' "$good" >"$P"
for v in 1e30 inf nan 1e-3; do
    expect_error "kv_memory_$v" 2 "--kv-cache-memory: '$v' is not a size from 1K to 1P" --kv-cache-memory "$v" "$P"
done
expect_error kv_memory_above_node 1 "is above this node's memory" --kv-cache-memory 1T "$P"
expect_error dp_huge 2 "-dp: 1073741824 is out of range: it takes 1 to 65536" -dp 1073741824 "$P"
expect_error block_huge 2 "--block-size: 1073741824 is out of range: it takes 1 to 65536" \
    --block-size 1073741824 --cp-kv-cache-interleave-size 1073741824 "$P"

# buffers follow the requests there are, not the limits: a million
# sequences per step used to ask for a million logits rows up front
"$MKMODEL" --out "$WORK/v32k" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab 32000 >/dev/null
run_dcp huge_limits --model "$WORK/v32k" --max-num-seqs 1048576 --max-num-batched-tokens 1048576 \
    --max-tokens 1073741824 --max-model-len 64 --output "$WORK/hl.h5" "$P"
checks=$((checks + 1))
if [ "$(cat "$WORK/huge_limits.rc")" = 0 ] && grep -q '^  g .* 2 length' "$WORK/huge_limits.out"; then
    pass "--max-num-seqs 2^20, --max-num-batched-tokens 2^20, --max-tokens 2^30: runs in the memory of its one request"
else
    fail "huge limits: exit $(cat "$WORK/huge_limits.rc")"; cat "$WORK/huge_limits.err" >&2
fi

# ---- a text prompt that encodes to no tokens (no BOS on an HF model) ---------
TOK=$SHARED/models/stories260K/tok512.bin
if [ -f "$TOK" ]; then
    "$MKMODEL" --out "$WORK/hf512" --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 64 --vocab 512 >/dev/null
    printf '{"id": "empty", "prompt": ""}\n{"id": "ok", "prompt": "Once", "max_tokens": 2}\n' >"$WORK/e.jsonl"
    expect_error empty_text_prompt 4 'request "empty": the prompt encodes to no tokens' --model "$WORK/hf512" \
        --tokenizer "$TOK" --output "$WORK/e.h5" "$WORK/e.jsonl"
fi
finish
