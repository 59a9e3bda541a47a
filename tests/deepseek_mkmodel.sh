#!/bin/sh
# dcpinfer-mkmodel writes DeepSeek-V2/V3 models (float32, block-scaled FP8
# with F8_E4M3 tensors and their weight_scale_inv, INT4 W4A16 experts as
# compressed-tensors packs them, and NVFP4 experts as compressed-tensors
# and as ModelOpt write them; bf16) that dcpinfer runs,
# each giving the same greedy tokens at one rank and at -tp 4 -dcp 4 and
# -tp 8 -dcp 8 (latent cache split over the DCP group). (That transformers
# loads the float32 folders as its classes with no missing or unexpected
# weights, and gives the same tokens, was checked by hand: docs/models.md.)
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
SHAPE="--layers 3 --dim 64 --heads 8 --hidden 96 --vocab 256 --first-dense 1"
"$MKMODEL" --out "$WORK/v3" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob >/dev/null &&
    "$MKMODEL" --out "$WORK/v3fp8" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob --fp8-block 16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3int4" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob --quant int4-w4a16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3nvfp4" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob --quant nvfp4 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3modelopt" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob \
        --quant nvfp4-modelopt >/dev/null &&
    "$MKMODEL" --out "$WORK/v2" --arch deepseek_v2 $SHAPE --n-group 4 --topk-group 2 >/dev/null ||
    { echo "FAIL: dcpinfer-mkmodel could not write the models" >&2; exit 1; }
checks=$((checks + 1))
if grep -q F8_E4M3 "$WORK/v3fp8/model.safetensors" && grep -q weight_scale_inv "$WORK/v3fp8/model.safetensors" &&
    ! grep -q F8_E4M3 "$WORK/v3/model.safetensors"; then
    pass "--fp8-block writes F8_E4M3 matrices with weight_scale_inv"
else
    fail "--fp8-block: no FP8 tensors"
fi
checks=$((checks + 1))
if grep -q '"weight_packed"\|experts.0.gate_proj.weight_packed' "$WORK/v3int4/model.safetensors" &&
    grep -q '"quant_method": "compressed-tensors"' "$WORK/v3int4/config.json" &&
    ! grep -q 'experts.0.gate_proj.weight"' "$WORK/v3int4/model.safetensors" &&
    grep -q 'self_attn.q_a_proj.weight"' "$WORK/v3int4/model.safetensors"; then
    pass "--quant int4-w4a16 packs the routed experts (compressed-tensors), the rest float32"
else
    fail "--quant int4-w4a16: not the expected tensors"
fi
P=$WORK/p.jsonl
printf '{"id": "a", "prompt_token_ids": [5, 17, 200, 31, 9, 77, 140, 3, 62, 250, 18, 99], "max_tokens": 24, "temperature": 0}\n{"id": "b", "prompt_token_ids": [7, 7, 7, 1], "max_tokens": 30, "temperature": 0}\n' >"$P"
ids() { grep -o '"token_ids":\[[^]]*\]' "$1"; }
for m in v3 v3fp8 v3int4 v3nvfp4 v3modelopt v2; do
    run_dcp "$m-1" --model "$WORK/$m" --output "$WORK/$m-1.jsonl" "$P"
    for layout in "4 -tp 4 -dcp 4" "8 -tp 8 -dcp 8 --dcp-comm-backend a2a"; do
        checks=$((checks + 1))
        np=${layout%% *}
        NP=$np run_dcp "$m-$np" --model "$WORK/$m" ${layout#"$np"} --max-num-batched-tokens 8 --max-num-seqs 4 --output "$WORK/$m-$np.jsonl" "$P"
        if [ "$(cat "$WORK/$m-1.rc")$(cat "$WORK/$m-$np.rc")" = 00 ] && [ -n "$(ids "$WORK/$m-1.jsonl")" ] &&
            [ "$(ids "$WORK/$m-1.jsonl")" = "$(ids "$WORK/$m-$np.jsonl")" ]; then
            pass "$m: ${layout#"$np" } gives one rank's tokens"
        else
            fail "$m: ${layout#"$np" }: exit $(cat "$WORK/$m-1.rc") $(cat "$WORK/$m-$np.rc")"; cat "$WORK/$m-$np.err" >&2
        fi
    done
done
# bf16 checkpoints (Kimi K2.x stores everything but its INT4 experts so)
# stay bf16 in memory under --dtype auto: the same tokens and log-probs,
# to the bit, as the same checkpoint widened to float32 (--dtype float32),
# at one rank and at -tp 4 -dcp 4, in less weight memory (one rank: the
# bf16 matrices half their float32 bytes; the INT4 experts as they were)
"$MKMODEL" --out "$WORK/v3bf16" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob --quant int4-w4a16 \
    --dtype bf16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v2bf16" --arch deepseek_v2 $SHAPE --n-group 4 --topk-group 2 --dtype bf16 >/dev/null ||
    { echo "FAIL: dcpinfer-mkmodel could not write the bf16 models" >&2; exit 1; }
PL=$WORK/pl.jsonl
sed 's/"temperature": 0}/"temperature": 0, "logprobs": 3}/' "$P" >"$PL"
results() { sed 's/"metrics":{[^}]*}//' "$1"; } # all but the timings
weight_mib() { sed -n 's/^# weights: .*; \([0-9.]*\) MiB on this rank.*/\1/p' "$1"; }
for m in v3bf16 v2bf16; do
    run_dcp "$m-f32" --model "$WORK/$m" --dtype float32 --output "$WORK/$m-f32.jsonl" "$PL"
    for layout in "1" "4 -tp 4 -dcp 4 --max-num-batched-tokens 8 --max-num-seqs 4"; do
        checks=$((checks + 1))
        np=${layout%% *}
        NP=$np run_dcp "$m-$np" --model "$WORK/$m" ${layout#"$np"} --output "$WORK/$m-$np.jsonl" "$PL"
        a=$(weight_mib "$WORK/$m-$np.out") f=$(weight_mib "$WORK/$m-f32.out")
        if [ "$(cat "$WORK/$m-f32.rc")$(cat "$WORK/$m-$np.rc")" = 00 ] && grep -q '"token_logprob"\|"logprob"' "$WORK/$m-$np.jsonl" &&
            [ "$(results "$WORK/$m-$np.jsonl")" = "$(results "$WORK/$m-f32.jsonl")" ] &&
            grep -q '^# weights: .*attention bfloat16' "$WORK/$m-$np.out" &&
            grep -q '^# weights: .*attention float32' "$WORK/$m-f32.out" &&
            awk -v a="$a" -v f="$f" -v np="$np" 'BEGIN { exit !(a > 0 && (np > 1 || a < 0.75 * f)) }'; then
            pass "$m at $np rank(s): bf16 as stored ($a MiB per rank; widened at one rank $f), the widened results to the bit"
        else
            fail "$m at $np rank(s): exit $(cat "$WORK/$m-f32.rc") $(cat "$WORK/$m-$np.rc"), weights $a against $f MiB"
            cat "$WORK/$m-$np.err" >&2
        fi
    done
done
# Kimi K2's config names the DeepSeek-V3 architecture with model_type
# "kimi_k2", and K2.5's wraps it as the text_config of
# KimiK25ForConditionalGeneration (tensors under language_model., a vision
# tower beside them): the INT4 model so rewritten, and so wrapped, gives
# the same tokens, and the summary says the vision tower was left out
mkdir "$WORK/kimi" && ln -s "$WORK/v3int4/model.safetensors" "$WORK/kimi/model.safetensors" &&
    sed 's/"model_type": *"deepseek_v3"/"model_type": "kimi_k2"/' "$WORK/v3int4/config.json" >"$WORK/kimi/config.json"
"$MKMODEL" --out "$WORK/kimi25" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob --quant int4-w4a16 \
    --kimi-k25 >/dev/null
printf '{"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25"}\n' >"$WORK/bad25.json"
mkdir "$WORK/bad25" && cp "$WORK/bad25.json" "$WORK/bad25/config.json"
expect_error kimi25_no_text 1 'KimiK25ForConditionalGeneration without a "text_config" object' --model "$WORK/bad25" "$P"
for m in kimi kimi25; do
    for np in 1 4; do
        checks=$((checks + 1))
        NP=$np run_dcp "$m-$np" --model "$WORK/$m" $([ $np = 4 ] && echo -tp 4 -dcp 4) --output "$WORK/$m-$np.jsonl" "$P"
        if grep -q '"model_type": "kimi_k2' "$WORK/$m/config.json" && [ "$(cat "$WORK/$m-$np.rc")" = 0 ] &&
            [ "$(ids "$WORK/$m-$np.jsonl")" = "$(ids "$WORK/v3int4-1.jsonl")" ] &&
            { [ $m = kimi ] || cat "$WORK/$m-$np.out" "$WORK/$m-$np.err" | grep -q "its vision tower not loaded"; }; then
            pass "$m at $np rank(s): the DeepSeek-V3 INT4 model's tokens"
        else
            fail "$m at $np rank(s): exit $(cat "$WORK/$m-$np.rc")"; cat "$WORK/$m-$np.err" >&2
        fi
    done
done
finish
