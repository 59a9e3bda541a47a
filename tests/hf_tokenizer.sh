#!/bin/sh
# Text prompts through a Hugging Face tokenizer.json: given with
# --tokenizer (the file or its folder) or found in the model's folder, the
# prompt ids dcpinfer runs are those the tokenizers package gives with
# special tokens (tests/data/tok, from tests/ref/make_tok_refs.py); a
# tokenizer with ids beyond the model's vocabulary is refused, and so is
# one that cannot spell more than padding of the model's.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
TOK=$SHARED/tokenizers/mistral-sp/tokenizer.json
[ -f "$TOK" ] || { echo "$TOK not found: skipped" >&2; exit 77; }
"$MKMODEL" --out "$WORK/m" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab 32000 >/dev/null
REF=$SRC/tests/data/tok/mistral-sp.jsonl
P=$WORK/p.jsonl
printf '{"id": "a", "prompt": "Hello world", "max_tokens": 3}\n{"id": "b", "prompt": "Once upon a time, there was a little girl named Lily.", "max_tokens": 3}\n{"id": "c", "prompt": "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "max_tokens": 3}\n' >"$P"
# the reference ids (with special tokens) of a corpus text
want() { grep -F "{\"text\": \"$1\"," "$REF" | sed 's/.*"with_special": \[\([^]]*\)\].*/\1/' | tr -d ' '; }
expected=$(printf '%s\n%s\n%s\n' "$(want "Hello world")" "$(want "Once upon a time, there was a little girl named Lily.")" \
    "$(want "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️")")
for how in file folder model; do
    checks=$((checks + 1))
    case $how in
        file) args="--model $WORK/m --tokenizer $TOK" ;;
        folder) args="--model $WORK/m --tokenizer $(dirname "$TOK")" ;;
        model) cp "$TOK" "$WORK/m/tokenizer.json"; args="--model $WORK/m" ;;
    esac
    run_dcp "$how" $args --output "$WORK/$how.h5" "$P"
    got=$(prompts "$WORK/$how.h5")
    if [ "$(cat "$WORK/$how.rc")" = 0 ] && [ -n "$got" ] && [ "$got" = "$expected" ]; then
        pass "tokenizer.json ($how): the prompt ids of tokenizers"
    else
        fail "tokenizer.json ($how): exit $(cat "$WORK/$how.rc"); got '$got', want '$expected'"; cat "$WORK/$how.err" >&2
    fi
done
# generation_config.json's eos_token_id joins config.json's: a greedy run
# stops at the first token that is one of them; tokenizer_config.json's
# add_bos_token / add_eos_token change the ids the prompt gets
printf '{"id": "g", "prompt": "Hello world", "max_tokens": 6, "temperature": 0}\n' >"$WORK/g.jsonl"
ids() { sed 's/.*"token_ids":\[\([^]]*\)\].*/\1/' "$1"; }
prompt_len() { sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$1"; }
run_dcp free --model "$WORK/m" --output "$WORK/free.jsonl" "$WORK/g.jsonl"
free_ids=$(ids "$WORK/free.jsonl")
third=$(echo "$free_ids" | cut -d, -f3)
first_third=$(echo "$free_ids" | tr ',' '\n' | grep -n "^$third\$" | head -1 | cut -d: -f1)
checks=$((checks + 1))
printf '{"eos_token_id": [7, %s]}\n' "$third" >"$WORK/m/generation_config.json"
run_dcp gen_eos --model "$WORK/m" --output "$WORK/gen_eos.jsonl" "$WORK/g.jsonl"
want=$(echo "$free_ids" | cut -d, -f1-"$first_third")
if [ "$(ids "$WORK/gen_eos.jsonl")" = "$want" ] && grep -q '"finish_reason":"stop"' "$WORK/gen_eos.jsonl"; then
    pass "generation_config.json: EOS $third ends the request after $first_third tokens ($want)"
else
    fail "generation_config.json: ids $(ids "$WORK/gen_eos.jsonl"), want $want (free run $free_ids)"
fi
rm -f "$WORK/m/generation_config.json"
checks=$((checks + 1))
base=$(prompt_len "$WORK/free.jsonl")
printf '{"add_bos_token": false, "bos_token": "<s>", "eos_token": "</s>"}\n' >"$WORK/m/tokenizer_config.json"
run_dcp no_bos --model "$WORK/m" --output "$WORK/no_bos.jsonl" "$WORK/g.jsonl"
printf '{"add_bos_token": true, "add_eos_token": true, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}\n' \
    >"$WORK/m/tokenizer_config.json"
run_dcp with_eos --model "$WORK/m" --output "$WORK/with_eos.jsonl" "$WORK/g.jsonl"
if [ "$(prompt_len "$WORK/no_bos.jsonl")" = $((base - 1)) ] && [ "$(prompt_len "$WORK/with_eos.jsonl")" = $((base + 1)) ]; then
    pass "tokenizer_config.json: add_bos_token false drops BOS, add_eos_token true appends EOS ($base prompt ids before)"
else
    fail "tokenizer_config.json: prompt ids $(prompt_len "$WORK/no_bos.jsonl") and $(prompt_len "$WORK/with_eos.jsonl"), base $base"
fi
# tokenizer_config.json: special tokens that the tokenizer lacks, or of
# the wrong type, are refused (they were ignored); a FIFO is not read
printf '{"eos_token": "<|im_end|>"}\n' >"$WORK/m/tokenizer_config.json"
expect_error config_missing_eos 1 'tokenizer_config.json: "eos_token" names "<|im_end|>", which the tokenizer does not have' \
    --model "$WORK/m" "$P"
printf '{"bos_token": 1}\n' >"$WORK/m/tokenizer_config.json"
expect_error config_bos_type 1 'tokenizer_config.json: "bos_token" must be a token'"'"'s text or an object with "content"' \
    --model "$WORK/m" "$P"
rm "$WORK/m/tokenizer_config.json"
mkfifo "$WORK/m/tokenizer_config.json"
LIMIT=30 expect_error config_fifo 1 'tokenizer_config.json: the tokenizer config file is not a regular file (a FIFO)' \
    --model "$WORK/m" "$P"
rm -f "$WORK/m/tokenizer.json" "$WORK/m/tokenizer_config.json"
# a model whose vocabulary the tokenizer covers but for padding runs; one
# with thousands of ids the tokenizer cannot spell is refused
"$MKMODEL" --out "$WORK/pad" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab 32256 >/dev/null
"$MKMODEL" --out "$WORK/wide" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab 40000 >/dev/null
run_dcp padded --model "$WORK/pad" --tokenizer "$TOK" --output "$WORK/pad.h5" "$P"
checks=$((checks + 1))
if [ "$(cat "$WORK/padded.rc")" = 0 ]; then pass "a vocabulary padded by 256 ids past the tokenizer's runs"
else fail "padded vocabulary: exit $(cat "$WORK/padded.rc")"; cat "$WORK/padded.err" >&2; fi
expect_error tokenizer_too_small 1 "tokenizer.json: the tokenizer spells ids 0-31999, the model's vocabulary has 40000: 8000 ids it cannot spell" \
    --model "$WORK/wide" --tokenizer "$TOK" "$P"
if [ -f "$SHARED/tokenizers/llama3/tokenizer.json" ]; then
    expect_error tokenizer_too_big 1 "the tokenizer has ids up to 128255, the model's vocabulary only 32000" \
        --model "$WORK/m" --tokenizer "$SHARED/tokenizers/llama3/tokenizer.json" "$P"
fi
# A Kimi K2.x tokenizer folder: tiktoken.model (here cl100k_base's ranks),
# tokenizer_config.json naming TikTokenTokenizer and the special tokens
# after the ranks, found in the model's folder; the prompt ids are
# tiktoken's (tests/data/tok/kimi-cl100k.jsonl, from
# tests/ref/make_tiktoken_refs.py), special tokens in the text included;
# another tokenizer class, or no config, is refused
CL100K=$SHARED/tokenizers/cl100k/cl100k_base.tiktoken
if [ -f "$CL100K" ]; then
    "$MKMODEL" --out "$WORK/kimi" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab 100512 >/dev/null
    ln -s "$CL100K" "$WORK/kimi/tiktoken.model"
    printf '{"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]", "added_tokens_decoder": {"100256": {"content": "[BOS]", "special": true}, "100257": {"content": "[EOS]", "special": true}, "100258": {"content": "<|im_end|>", "special": true}, "100259": {"content": "<|im_user|>", "special": true}, "100265": {"content": "<|im_middle|>", "special": true}}}\n' >"$WORK/kimi/tokenizer_config.json"
    KREF=$SRC/tests/data/tok/kimi-cl100k.jsonl
    : >"$WORK/kp.jsonl"
    kexpected=""
    # (and, last, a reserved id's name: 256 reserved after the ranks)
    for n in 6 19 20; do
        line=$(sed -n "${n}p" "$KREF")
        text=$(echo "$line" | sed 's/^{"text": \(".*"\), "ids": .*/\1/')
        printf '{"prompt": %s, "max_tokens": 2}\n' "$text" >>"$WORK/kp.jsonl"
        kexpected="$kexpected$(echo "$line" | sed 's/.*"ids": \[\([^]]*\)\].*/\1/' | tr -d ' ')
"
    done
    printf '{"prompt": "<|reserved_token_100400|>", "max_tokens": 1}\n' >>"$WORK/kp.jsonl"
    kexpected="${kexpected}100400
"
    run_dcp kimi --model "$WORK/kimi" --output "$WORK/kimi.h5" "$WORK/kp.jsonl"
    got=$(prompts "$WORK/kimi.h5")
    checks=$((checks + 1))
    if [ "$(cat "$WORK/kimi.rc")" = 0 ] && [ -n "$got" ] && [ "$got" = "$(printf '%s' "$kexpected")" ]; then
        pass "tiktoken.model (Kimi K2's tokenizer, cl100k ranks): the prompt ids of tiktoken"
    else
        fail "tiktoken.model: exit $(cat "$WORK/kimi.rc"); got '$got', want '$kexpected'"; cat "$WORK/kimi.err" >&2
    fi
    # the reserved ids: as tokenization_kimi.py says, when it is there
    printf '{"prompt": "<|reserved_token_100400|>", "max_tokens": 1}\n' >"$WORK/kr.jsonl"
    printf 'class TikTokenTokenizer:\n    n = range(self.num_reserved_special_tokens)\n    num_reserved_special_tokens = 100\n' \
        >"$WORK/kimi/tokenization_kimi.py"
    run_dcp kimi_r100 --model "$WORK/kimi" --output "$WORK/kimi_r100.h5" "$WORK/kr.jsonl"
    rm "$WORK/kimi/tokenization_kimi.py"
    checks=$((checks + 1))
    r100=$(prompts "$WORK/kimi_r100.h5")
    if [ -n "$r100" ] && [ "$r100" != 100400 ]; then
        pass "tiktoken.model: tokenization_kimi.py's num_reserved_special_tokens (100) instead of 256"
    else
        fail "tiktoken.model reserved ids: '$r100' with 100"; cat "$WORK/kimi_r100.err" >&2
    fi
    printf '{"tokenizer_class": "QWenTokenizer"}\n' >"$WORK/kimi/tokenizer_config.json"
    expect_error tiktoken_class 1 'tokenizer_class "QWenTokenizer": dcpinfer reads tiktoken files with Kimi K2'"'"'s TikTokenTokenizer (its split pattern) only' \
        --model "$WORK/kimi" "$P"
    rm "$WORK/kimi/tokenizer_config.json"
    expect_error tiktoken_no_config 1 'a tiktoken file needs the tokenizer_config.json beside it' --model "$WORK/kimi" "$P"
fi
finish
