#!/bin/sh
# What dcpinfer cannot run exactly is refused before any weight is read,
# with one line and exit status 1: an architecture outside the supported
# list (named as such, before its other fields), an activation other than
# SiLU, an unknown or unsupported RoPE type, a tensor the config has no use
# for, a tensor whose shape differs from what the config implies. DeepSeek-V2/V3
# configs (tests/data/deepseek) are read and checked field by field: an
# unsupported value is its own line, a dimension near 2^31 too; a YaRN
# factor, original_max_position_embeddings or attention_factor that is
# given must be positive. GLM-4.5's partial RoPE, groups and quantization
# likewise.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
P=$WORK/p.jsonl
printf '{"id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 2}\n' >"$P"
"$MKMODEL" --out "$WORK/base" --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 48 --vocab 64 >/dev/null
"$MKMODEL" --out "$WORK/biased" --layers 1 --dim 32 --heads 4 --kv-heads 2 --hidden 48 --vocab 64 --mlp-bias >/dev/null
variant() { # NAME SED: a copy of the base model with its config.json edited
    rm -rf "${WORK:?}/$1"
    cp -r "$WORK/${3:-base}" "$WORK/$1"
    sed -i "$2" "$WORK/$1/config.json"
}
variant gemma 's/"LlamaForCausalLM"/"GemmaForCausalLM"/; s/"llama"/"gemma"/; s/"silu"/"gelu_pytorch_tanh"/'
expect_error unknown_architecture 1 "architecture GemmaForCausalLM is not supported; supported: LlamaForCausalLM (llama), MistralForCausalLM (mistral), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3)" \
    --model "$WORK/gemma" --output "$WORK/o.h5" "$P"
variant gelu 's/"silu"/"gelu"/'
expect_error hidden_act 1 "hidden_act gelu is not supported (silu only)" --model "$WORK/gelu" "$P"
variant longrope 's/"rope_scaling": null/"rope_scaling": {"rope_type": "longrope", "factor": 2.0}/'
expect_error unknown_rope_type 1 'rope type "longrope" is not supported; supported: default, linear, llama3, yarn' \
    --model "$WORK/longrope" "$P"
variant dynamic 's/"rope_scaling": null/"rope_scaling": {"type": "dynamic", "factor": 2.0}/'
expect_error dynamic_rope 1 "rope type dynamic is not supported (its frequencies change with the sequence length)" \
    --model "$WORK/dynamic" "$P"
variant leftover 's/"mlp_bias": true/"mlp_bias": false/' biased
expect_error leftover_tensor 1 "tensor 'model.layers.0.mlp.gate_proj.bias' is in the checkpoint, but config.json (LlamaForCausalLM) has no use for it" \
    --model "$WORK/leftover" "$P"
variant shape 's/"intermediate_size": 48/"intermediate_size": 40/'
expect_error shape_mismatch 1 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [48, 32], config.json implies [40, 32]" \
    --model "$WORK/shape" "$P"
# DeepSeek: only config.json is needed, weights are never read
deepseek() { # NAME CASE SED
    mkdir -p "$WORK/$1"
    sed "$3" "$SRC/tests/data/deepseek/$2/config.json" >"$WORK/$1/config.json"
}
deepseek ds_scoring v3_yarn 's/"n_group": 4,/"n_group": 4, "scoring_func": "softmax",/'
expect_error deepseek_scoring_func 1 'scoring_func "softmax" is not supported for DeepseekV3ForCausalLM (supported: sigmoid)' \
    --model "$WORK/ds_scoring" "$P"
deepseek ds_method v2_softmax 's/"topk_method": "group_limited_greedy"/"topk_method": "noaux_tc"/'
expect_error deepseek_topk_method 1 'topk_method "noaux_tc" is not supported for DeepseekV2ForCausalLM (supported: greedy, group_limited_greedy)' \
    --model "$WORK/ds_method" "$P"
deepseek ds_rope v3_yarn 's/"rope_type": "yarn"/"rope_type": "longrope"/; s/"type": "yarn"/"type": "longrope"/'
expect_error deepseek_rope_type 1 'rope type "longrope" is not supported; supported: default, linear, llama3, yarn' \
    --model "$WORK/ds_rope" "$P"
deepseek ds_gptq v3_yarn 's/"n_group": 4,/"n_group": 4, "quantization_config": {"quant_method": "gptq", "bits": 4},/'
expect_error deepseek_quantization 1 'quantization_config gptq is not supported (block-scaled fp8, compressed-tensors pack-quantized INT4 or NVFP4, modelopt NVFP4)' \
    --model "$WORK/ds_gptq" "$P"
# block-scaled FP8 with static activation scales (not applied) or a block
# past the bound
deepseek ds_static v3_fp8 's/"activation_scheme": "dynamic"/"activation_scheme": "static"/'
expect_error deepseek_fp8_static 1 'quantization_config fp8 "activation_scheme": static is not supported (dynamic only' \
    --model "$WORK/ds_static" "$P"
deepseek ds_block v3_fp8 '/"weight_block_size"/{n;s/[0-9][0-9]*/2147483648/}'
expect_error deepseek_fp8_block 1 'quantization_config fp8 needs "weight_block_size": [rows, cols], each from 1 to 1048576' \
    --model "$WORK/ds_block" "$P"
# a copy of the FP8 test checkpoint to damage, and where a tensor's bytes
# lie in its model.safetensors: "START END", file offsets
fp8_copy() { # NAME
    mkdir -p "$WORK/$1" && cp "$SRC/tests/data/deepseek/v3_fp8/"* "$WORK/$1/" && chmod u+w "$WORK/$1/"*
}
tensor_bytes() { # FILE TENSOR
    local hlen name
    hlen=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    name=$(echo "$2" | sed 's/\./\\./g')
    dd if="$1" bs=1 skip=8 count="$hlen" 2>/dev/null |
        sed -n "s/.*\"$name\":{[^}]*\"data_offsets\":\[\([0-9]*\),\([0-9]*\)\].*/\1 \2/p" |
        awk -v h="$hlen" '{print 8 + h + $1, 8 + h + $2}'
}
# an FP8 block scale that is NaN: the tensor and block named, not NaN logits
fp8_copy ds_nan
set -- $(tensor_bytes "$WORK/ds_nan/model.safetensors" model.layers.0.self_attn.q_a_proj.weight_scale_inv)
printf '\000\000\300\177' | dd of="$WORK/ds_nan/model.safetensors" bs=1 seek="$1" conv=notrunc 2>/dev/null # NaN, little-endian
expect_error deepseek_fp8_nan_scale 1 "tensor 'model.layers.0.self_attn.q_a_proj.weight_scale_inv': block [0, 0] has the scale nan, not a finite number" \
    --model "$WORK/ds_nan" "$P"
# an FP8 scale tensor of zeros (every block): the tensor named, not a model
# that silently computes with a zero matrix
fp8_copy ds_zero
set -- $(tensor_bytes "$WORK/ds_zero/model.safetensors" model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv)
head -c $(($2 - $1)) /dev/zero | dd of="$WORK/ds_zero/model.safetensors" bs=1 seek="$1" conv=notrunc 2>/dev/null
expect_error deepseek_fp8_zero_scales 1 "tensor 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv': all " \
    --model "$WORK/ds_zero" "$P"
# modules_to_not_convert naming a module the checkpoint stores in FP8
fp8_copy ds_not_convert
deepseek ds_not_convert v3_fp8 's/"activation_scheme": "dynamic"/"activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head", "model.layers.1.self_attn"]/'
expect_error deepseek_fp8_not_convert 1 "tensor 'model.layers.1.self_attn.q_a_proj.weight' is FP8, but config.json's quantization_config lists 'model.layers.1.self_attn.q_a_proj' in modules_to_not_convert" \
    --model "$WORK/ds_not_convert" "$P"
# compressed-tensors: what is not INT4 W4A16 pack-quantized, symmetric, in one group
ct() { # NAME GROUP [FORMAT]
    deepseek "$1" v3_yarn "s/\"n_group\": 4,/\"n_group\": 4, \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"${3:-pack-quantized}\", \"config_groups\": {\"group_0\": $2}, \"ignore\": [\"lm_head\"]},/"
}
W4='"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32}'
ct ct_marlin "{$W4}" marlin-24
expect_error ct_format 1 'compressed-tensors format "marlin-24" is not supported (pack-quantized INT4 or nvfp4-pack-quantized)' \
    --model "$WORK/ct_marlin" "$P"
ct ct_nvfp4 "{$W4}" nvfp4-pack-quantized
expect_error ct_nvfp4_int 1 'nvfp4-pack-quantized weights must be 4-bit floats in tensor groups of 16' \
    --model "$WORK/ct_nvfp4" "$P"
ct ct_w4a4 "{$(echo "$W4" | sed 's/"type": "int"/"type": "float"/; s/"group"/"tensor_group"/; s/32}/16}/'), \"input_activations\": {\"num_bits\": 4, \"type\": \"float\"}}" nvfp4-pack-quantized
expect_error ct_w4a4 1 'NVFP4 input_activations must be 4-bit floats in tensor groups of 16, dynamic "local"' \
    --model "$WORK/ct_w4a4" "$P"
# ModelOpt: config.json's quantization_config and hf_quant_config.json must
# say the same (the module lists as sets, the KV cache's algorithm)
mo() { # NAME SED (on hf_quant_config.json)
    mkdir -p "$WORK/$1"
    ln -sf "$SRC/tests/data/deepseek/v3_w4a4_mo/config.json" "$SRC/tests/data/deepseek/v3_w4a4_mo/model.safetensors" \
        "$WORK/$1/"
    sed "$2" "$SRC/tests/data/deepseek/v3_w4a4_mo/hf_quant_config.json" >"$WORK/$1/hf_quant_config.json"
}
mo mo_exclude 's/"model.layers.0.mlp\*",//'
expect_error modelopt_exclude 1 '"model.layers.0.mlp*" is in quantization_config'"'"'s ignore but not in hf_quant_config.json'"'"'s exclude_modules: the two files must exclude the same modules' \
    --model "$WORK/mo_exclude" "$P"
mo mo_kv 's/"kv_cache_quant_algo": "FP8"/"kv_cache_quant_algo": "INT8"/'
expect_error modelopt_kv 1 'quantization_config kv_cache_quant_algo is "FP8", but' --model "$WORK/mo_kv" "$P"
# an FP8 KV cache's scales: 8-bit floats, static, per tensor
deepseek ct_kv v3_int4 's/"quant_method": "compressed-tensors"/"kv_cache_scheme": {"num_bits": 8, "type": "int", "strategy": "tensor"}, &/'
expect_error ct_kv_scheme 1 'kv_cache_scheme must be 8-bit floats with a static scale per tensor' --model "$WORK/ct_kv" "$P"
mo mo_algo 's/"quant_algo": "NVFP4"/"quant_algo": "FP8"/'
expect_error modelopt_algo 1 'quantization_config quant_algo is "NVFP4", but' --model "$WORK/mo_algo" "$P"
ct ct_asym "{$(echo "$W4" | sed 's/"symmetric": true/"symmetric": false/')}"
expect_error ct_asym 1 'asymmetric INT4 (weight_zero_point) is not supported (symmetric only)' --model "$WORK/ct_asym" "$P"
ct ct_w4a8 "{$W4, \"input_activations\": {\"num_bits\": 8, \"type\": \"int\"}}"
expect_error ct_w4a8 1 'quantized input activations are not supported (W4A16: input_activations null)' \
    --model "$WORK/ct_w4a8" "$P"
ct ct_w8 "{$(echo "$W4" | sed 's/"num_bits": 4/"num_bits": 8/')}"
expect_error ct_w8 1 'pack-quantized weights must be 4-bit ints in groups' --model "$WORK/ct_w8" "$P"
# an INT4 checkpoint whose config does not announce a quantized matrix, and one
# whose config quantizes a matrix the checkpoint holds whole
mkdir -p "$WORK/ct_unannounced" "$WORK/ct_missing"
ln -s "$SRC/tests/data/deepseek/v3_int4/model.safetensors" "$WORK/ct_unannounced/model.safetensors"
ln -s "$SRC/tests/data/deepseek/v3_int4/model.safetensors" "$WORK/ct_missing/model.safetensors"
sed 's/"lm_head",/"lm_head", "re:.*experts.7.*",/' "$SRC/tests/data/deepseek/v3_int4/config.json" >"$WORK/ct_unannounced/config.json"
expect_error ct_unannounced 1 "tensor 'model.layers.1.mlp.experts.7.gate_proj.weight_packed' is packed 4-bit, but config.json's quantization_config does not quantize" \
    --model "$WORK/ct_unannounced" "$P"
sed 's/"re:.*shared_experts.*",//' "$SRC/tests/data/deepseek/v3_int4/config.json" >"$WORK/ct_missing/config.json"
expect_error ct_missing 1 "tensor 'model.layers.1.mlp.shared_experts.gate_proj.weight_packed' not found: config.json's quantization_config quantizes" \
    --model "$WORK/ct_missing" "$P"
# GLM-4.5: a rotated part that is odd, groups that do not divide the
# experts, a quantized checkpoint
glm() { # NAME SED
    mkdir -p "$WORK/$1"
    sed "$2" "$SRC/tests/data/hf/glm4_moe/config.json" >"$WORK/$1/config.json"
}
glm glm_partial 's/"partial_rotary_factor": 0.5/"partial_rotary_factor": 0.3/'
expect_error glm_partial_rotary 1 'partial_rotary_factor 0.3 of head_dim 32 rotates 9 dimensions: it must be an even count' \
    --model "$WORK/glm_partial" "$P"
glm glm_group 's/"n_group": 2/"n_group": 3/'
expect_error glm_n_group 1 'n_group 3 must divide n_routed_experts 8 into groups of two or more' --model "$WORK/glm_group" "$P"
glm glm_quant 's/"n_group": 2,/"n_group": 2, "quantization_config": {"quant_method": "fp8"},/'
expect_error glm_quantization 1 'quantization_config is not supported for Glm4MoeForCausalLM (bf16 or fp32 checkpoints)' \
    --model "$WORK/glm_quant" "$P"
deepseek ds_head v2_softmax 's/"head_dim": 8/"head_dim": 16/'
expect_error deepseek_head_dim 1 'head_dim 16 differs from qk_rope_head_dim 8' --model "$WORK/ds_head" "$P"
# dimensions near 2^31 are refused by name (they overflowed the sizes formed
# from them); given YaRN fields must be valid (they were replaced by defaults)
for f in kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim n_routed_experts; do
    deepseek "ds_$f" v3_yarn "s/\"$f\": [0-9]*/\"$f\": 2147483646/"
    expect_error "deepseek_huge_$f" 1 "$f is 2147483646; it must be at most" --model "$WORK/ds_$f" "$P"
done
mkdir -p "$WORK/yarn"
cp "$SRC/tests/data/hf/yarn/config.json" "$SRC/tests/data/hf/yarn/model.safetensors" "$WORK/yarn/"
for case in 'factor": 4/factor": 0/factor 0 must be positive' 'factor": 4/factor": -2/factor -2 must be positive' \
    'original_max_position_embeddings": 256/original_max_position_embeddings": 0/original_max_position_embeddings 0 must be positive' \
    'beta_slow": 1/beta_slow": 1, "attention_factor": -1/attention_factor -1 must be positive'; do
    from=${case%%/*} rest=${case#*/} to=${rest%%/*} want=${rest#*/}
    sed "s/$from/$to/" "$SRC/tests/data/hf/yarn/config.json" >"$WORK/yarn/config.json"
    expect_error "yarn_$(echo "$to" | tr -dc 'a-z0-9-')" 1 "rope type yarn: $want" --model "$WORK/yarn" "$P"
done
checks=$((checks + 1))
if [ ! -e "$WORK/o.h5" ]; then pass "no results file after a refusal"; else fail "a refused run wrote results"; fi
finish
