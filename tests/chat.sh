#!/bin/sh
# Chat requests end to end: "messages" lines rendered by the chat template
# (--chat-template, tokenizer_config.json's chat_template as a string or a
# list of named ones, chat_template.jinja beside the tokenizer) give the
# prompt ids of transformers' apply_chat_template (tests/data/chat, from
# tests/ref/make_chat_refs.py) for Llama 3.1 and Qwen3; raise_exception's
# message becomes the request's error; a conversation without a template,
# with tools or images fails alone; a template with a construct outside the
# engine's subset is refused at start-up with its line.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
CT=$SHARED/chat-templates
[ -f "$CT/Qwen-Qwen3-0.6B.jinja" ] && [ -f "$SHARED/tokenizers/qwen3/tokenizer.json" ] ||
    { echo "$CT or $SHARED/tokenizers not found: skipped" >&2; exit 77; }
DATA=$SRC/tests/data/chat
model() { # NAME VOCAB TOKENIZER: a one-layer model with that tokenizer's files
    "$MKMODEL" --out "$WORK/$1" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab "$2" >/dev/null
    for f in "$SHARED/tokenizers/$3"/*; do ln -s "$f" "$WORK/$1/"; done
}
model qwen 151936 qwen3
model llama 128256 llama3
for run in "llama llama3 meta-llama-Llama-3.1-8B-Instruct.jinja" "qwen qwen3 Qwen-Qwen3-0.6B.jinja" "qwen_config qwen3 -"; do
    set -- $run
    checks=$((checks + 1))
    m=$1
    [ "$m" = qwen_config ] && m=qwen
    if [ "$3" = - ]; then args="--model $WORK/$m"; else args="--model $WORK/$m --chat-template $CT/$3"; fi
    run_dcp "$1" $args --output "$WORK/$1.h5" "$DATA/requests-$2.jsonl"
    got=$(prompts "$WORK/$1.h5")
    if [ "$(cat "$WORK/$1.rc")" = 0 ] && [ -n "$got" ] && [ "$got" = "$(cat "$DATA/requests-$2.ids")" ]; then
        pass "$1: $(grep -c . "$DATA/requests-$2.ids") conversations, the prompt ids of apply_chat_template"
    else
        fail "$1: exit $(cat "$WORK/$1.rc"), prompt ids differ from apply_chat_template's"
        diff "$DATA/requests-$2.ids" - <<EOT >&2 | head -10
$got
EOT
        head -5 "$WORK/$1.err" >&2
    fi
done
# chat_template.jinja beside the tokenizer (Mistral Nemo's, whose
# tokenizer_config.json names none): its raise_exception is the request's
# error; without it, a conversation fails alone with the reason (exit 4:
# results written, some requests failed)
model mistral 32000 mistral-sp
printf '%s\n' '{"id": "ok", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}' \
    '{"id": "alt", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "max_tokens": 1}' \
    '{"id": "tools", "messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}], "max_tokens": 1}' \
    '{"id": "image", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "max_tokens": 1}' \
    '{"id": "plain", "prompt": "Hi", "max_tokens": 1}' \
    '{"id": "notext", "messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 1}' >"$WORK/m.jsonl"
rm "$WORK/mistral/tokenizer_config.json"
cp "$SHARED/tokenizers/mistral-sp/tokenizer_config.json" "$WORK/mistral/"
ln -s "$CT/mistralai-Mistral-Nemo-Instruct-2407.jinja" "$WORK/mistral/chat_template.jinja"
run_dcp mistral --model "$WORK/mistral" --output "$WORK/mistral.jsonl" "$WORK/m.jsonl"
err_of() { grep "\"id\":\"$2\"" "$1" | sed 's/.*"error":\(.*\)}$/\1/'; }
checks=$((checks + 1))
alt=$(err_of "$WORK/mistral.jsonl" alt)
ok_ids=$(grep '"id":"ok"' "$WORK/mistral.jsonl" | sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/')
# [INST]Hi[/INST] after BOS: 1, [INST], Hi, [/INST] as mistral-sp spells them
if [ "$(cat "$WORK/mistral.rc")" = 4 ] &&
    [ "$alt" = "\"$WORK/m.jsonl:2: request \\\"alt\\\": After the optional system message, conversation roles must alternate user/assistant/user/assistant/...\"" ] &&
    err_of "$WORK/mistral.jsonl" tools | grep -q 'dcpinfer does not run tools' &&
    err_of "$WORK/mistral.jsonl" image | grep -q 'not a text part (image_url)' &&
    err_of "$WORK/mistral.jsonl" notext | grep -q 'content\[0\] is a text part without a string \\"text\\"' &&
    [ "$(err_of "$WORK/mistral.jsonl" ok)" = null ] && [ "$(err_of "$WORK/mistral.jsonl" plain)" = null ]; then
    pass "chat_template.jinja: rendered ($ok_ids prompt ids); raise_exception, tools, images and a text part without text fail their request alone"
else
    fail "chat_template.jinja: exit $(cat "$WORK/mistral.rc"); alt error $alt"; cat "$WORK/mistral.jsonl" "$WORK/mistral.err" >&2
fi
rm "$WORK/mistral/chat_template.jinja"
run_dcp none --model "$WORK/mistral" --output "$WORK/none.jsonl" "$WORK/m.jsonl"
checks=$((checks + 1))
if [ "$(cat "$WORK/none.rc")" = 4 ] && err_of "$WORK/none.jsonl" ok | grep -q 'needs a chat template, and the tokenizer has none'; then
    pass "no chat template: a conversation fails alone, with the reason"
else
    fail "no chat template: exit $(cat "$WORK/none.rc")"; cat "$WORK/none.jsonl" >&2
fi
# tokenizer_config.json's chat_template as a list of named templates: "default"
sed 's/^{/{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D:{{ messages[0].content }}"}],/' \
    "$SHARED/tokenizers/mistral-sp/tokenizer_config.json" >"$WORK/mistral/tokenizer_config.json"
head -1 "$WORK/m.jsonl" >"$WORK/one.jsonl"
run_dcp named --model "$WORK/mistral" --output "$WORK/named.jsonl" "$WORK/one.jsonl"
checks=$((checks + 1))
# "D:Hi" without BOS: what the plain prompt "D:Hi" gives, less its BOS
printf '{"id": "ok", "prompt": "D:Hi", "max_tokens": 1}\n' >"$WORK/plain.jsonl"
run_dcp named_plain --model "$WORK/mistral" --output "$WORK/named_plain.jsonl" "$WORK/plain.jsonl"
n_chat=$(sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$WORK/named.jsonl")
n_plain=$(sed 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$WORK/named_plain.jsonl")
if [ "$(cat "$WORK/named.rc")" = 0 ] && [ -n "$n_chat" ] && [ "$n_chat" = $((n_plain - 1)) ]; then
    pass "a list of named chat templates: \"default\" rendered, no BOS added ($n_chat prompt ids)"
else
    fail "named templates: exit $(cat "$WORK/named.rc"), $n_chat prompt ids, plain $n_plain"; cat "$WORK/named.err" >&2
fi
# --reasoning-parser: the results carry each text's reasoning and content
# beside it (vLLM's split: tests/test_chat.c); a random model writes no
# "</think>", so deepseek_r1 takes the whole text as reasoning and qwen3 as
# content, in the JSON Lines and the HDF5 results alike
head -2 "$DATA/requests-qwen3.jsonl" >"$WORK/r.jsonl"
for p in deepseek_r1 qwen3; do
    run_dcp "rp_$p" --model "$WORK/qwen" --reasoning-parser "$p" --output "$WORK/rp_$p.jsonl" "$WORK/r.jsonl"
    run_dcp "rph_$p" --model "$WORK/qwen" --reasoning-parser "$p" --output "$WORK/rp_$p.h5" "$WORK/r.jsonl"
done
text1=$(head -1 "$WORK/rp_qwen3.jsonl" | sed 's/^{"id":"[^"]*","text":\("[^"]*"\),.*/\1/')
h5data() { h5dump -y -d "/requests/$2" "$1" | sed -n '/DATA {/,/}/p'; }
checks=$((checks + 1))
if grep -q "\"text\":$text1,\"reasoning_content\":$text1,\"content\":null" "$WORK/rp_deepseek_r1.jsonl" &&
    grep -q "\"text\":$text1,\"reasoning_content\":null,\"content\":$text1" "$WORK/rp_qwen3.jsonl" &&
    [ "$(h5data "$WORK/rp_deepseek_r1.h5" reasoning_content)" = "$(h5data "$WORK/rp_deepseek_r1.h5" text)" ] &&
    [ "$(h5data "$WORK/rp_qwen3.h5" content)" = "$(h5data "$WORK/rp_qwen3.h5" text)" ] &&
    [ -z "$(h5data "$WORK/rp_qwen3.h5" reasoning_content | sed -n '2,$p' | grep -v '^ *}' | tr -d ' ",')" ]; then
    pass "--reasoning-parser: reasoning_content and content beside the text ($text1), JSON Lines and HDF5"
else
    fail "--reasoning-parser: $(head -1 "$WORK/rp_deepseek_r1.jsonl" | cut -c1-200)"
fi
expect_error bad_parser 2 "--reasoning-parser granite: choose deepseek_r1, qwen3 or kimi_k2" \
    --model "$WORK/qwen" --reasoning-parser granite "$WORK/r.jsonl"
# OpenAI batch lines, chat and completions mixed: the results are
# chat.completion and text_completion objects that a reader written from
# OpenAI's documentation accepts (tests/read_batch_output.c), the chat
# ones with the message's reasoning_content split off, logprobs in the
# chat form, and the conversation's prompt ids those of apply_chat_template
think=$(sed -n '8p' "$DATA/requests-qwen3.jsonl" | sed 's/^{"id": "thinking-on", \("messages": .*\), "add_generation_prompt".*$/\1/')
n_think=$(sed -n '8p' "$DATA/requests-qwen3.ids" | tr ',' '\n' | grep -c .)
cat >"$WORK/batch.jsonl" <<JSON
{"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "q", $think, "chat_template_kwargs": {"enable_thinking": true}, "max_completion_tokens": 3, "logprobs": true, "top_logprobs": 2}}
{"custom_id": "p1", "method": "POST", "url": "/v1/completions", "body": {"model": "q", "prompt": "Hello", "max_tokens": 2}}
{"custom_id": "c2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "q", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "seed": 5, "stop": ["zz"]}}
{"custom_id": "c3", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "q", "prompt": "Hi"}}
{"custom_id": "c4", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "q", "messages": [{"role": "user", "content": "Hi"}], "logprobs": 2}}
{"custom_id": "p2", "method": "POST", "url": "/v1/completions", "body": {"model": "q", "messages": [{"role": "user", "content": "Hi"}]}}
JSON
run_dcp batch --model "$WORK/qwen" --reasoning-parser deepseek_r1 --skip-invalid --output "$WORK/batch_out.jsonl" "$WORK/batch.jsonl"
checks=$((checks + 1))
if [ "$(cat "$WORK/batch.rc")" != 4 ] || ! "$BUILD/tests/read_batch_output" "$WORK/batch_out.jsonl" >"$WORK/read.txt"; then
    fail "chat batch: exit $(cat "$WORK/batch.rc") (want 4), or the reader refused the file"; cat "$WORK/batch_out.jsonl" "$WORK/batch.err" >&2
else
    c1=$(grep '"custom_id":"c1"' "$WORK/batch_out.jsonl")
    r1=$(awk -F '\t' '$1 == "c1" && $2 == 200 {print $3 "|" $4}' "$WORK/read.txt")
    if echo "$c1" | grep -q '"object":"chat.completion"' && echo "$c1" | grep -q "\"prompt_tokens\":$n_think," &&
        [ "$(echo "$c1" | grep -o '"top_logprobs":\[{"token"' | wc -l)" = 3 ] &&
        [ "${r1%%|*}" = "(null)" ] && [ -n "${r1#*|}" ] &&
        grep '"custom_id":"p1"' "$WORK/batch_out.jsonl" | grep -q '"object":"text_completion"' &&
        grep '"custom_id":"c2"' "$WORK/batch_out.jsonl" | grep -q '"finish_reason":"length"' &&
        awk -F '\t' '$1 == "c3" && $2 == "error"' "$WORK/read.txt" | grep -q 'needs "messages"' &&
        awk -F '\t' '$1 == "c4" && $2 == "error"' "$WORK/read.txt" | grep -q '"logprobs" must be true or false' &&
        awk -F '\t' '$1 == "p2" && $2 == "error"' "$WORK/read.txt" | grep -q 'url.*chat/completions'; then
        pass "chat batch: chat.completion and text_completion lines the reader accepts; reasoning split, chat logprobs, $n_think prompt ids"
    else
        fail "chat batch: $(cat "$WORK/read.txt")"; echo "$c1" >&2
    fi
fi
# an OpenAI chat body without max_tokens runs to EOS or the context limit
# (vLLM's chat endpoint); a completions body gets --max-tokens (16); a
# given --max-tokens is every request's that does not say
cat >"$WORK/nomax.jsonl" <<JSON
{"custom_id": "c5", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "q", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}}
{"custom_id": "p3", "method": "POST", "url": "/v1/completions", "body": {"model": "q", "prompt": "Hello", "temperature": 0}}
JSON
run_dcp nomax --model "$WORK/qwen" --max-model-len 48 --output "$WORK/nomax_out.jsonl" "$WORK/nomax.jsonl"
run_dcp nomax5 --model "$WORK/qwen" --max-model-len 48 --max-tokens 5 --output "$WORK/nomax5_out.jsonl" "$WORK/nomax.jsonl"
usage() { grep "\"custom_id\":\"$2\"" "$1" | grep -o "\"$3\":[0-9]*" | grep -o '[0-9]*$'; }
checks=$((checks + 1))
cp=$(usage "$WORK/nomax_out.jsonl" c5 prompt_tokens) cc=$(usage "$WORK/nomax_out.jsonl" c5 completion_tokens)
if [ "$(cat "$WORK/nomax.rc")" = 0 ] && [ -n "$cp" ] && [ $((cp + cc)) = 48 ] &&
    [ "$(usage "$WORK/nomax_out.jsonl" p3 completion_tokens)" = 16 ] &&
    [ "$(usage "$WORK/nomax5_out.jsonl" c5 completion_tokens)" = 5 ] &&
    [ "$(usage "$WORK/nomax5_out.jsonl" p3 completion_tokens)" = 5 ]; then
    pass "chat body without max_tokens: $cc tokens to the context of 48 ($cp prompt); completions 16; --max-tokens 5: 5 each"
else
    fail "chat body without max_tokens: exit $(cat "$WORK/nomax.rc"), prompt $cp + completion $cc (want 48); $(cat "$WORK/nomax_out.jsonl" "$WORK/nomax5_out.jsonl" | cut -c1-300)"
fi
# a real split: a logit_bias on Qwen3's "</think>" (151668) makes the
# model close its reasoning mid-output; the own form's text is
# reasoning_content + "</think>" + content, and the chat.completion line's
# message carries the same two parts
printf '{"id": "t", "messages": [{"role": "user", "content": "Think about it."}], "chat_template_kwargs": {"enable_thinking": true}, "max_tokens": 12, "temperature": 1.0, "seed": 3, "logit_bias": {"151668": 11}}\n' >"$WORK/think.jsonl"
sed 's/^{"id": "t", /{"custom_id": "t", "method": "POST", "url": "\/v1\/chat\/completions", "body": {"model": "q", /; s/}$/}}/' \
    "$WORK/think.jsonl" >"$WORK/think_batch.jsonl"
run_dcp think --model "$WORK/qwen" --reasoning-parser qwen3 --output "$WORK/think_out.jsonl" "$WORK/think.jsonl"
run_dcp think_b --model "$WORK/qwen" --reasoning-parser qwen3 --output "$WORK/think_b_out.jsonl" "$WORK/think_batch.jsonl"
field() { sed "s/.*\"$2\":\"\([^\"]*\)\".*/\1/" "$1"; }
text=$(field "$WORK/think_out.jsonl" text) r=$(field "$WORK/think_out.jsonl" reasoning_content) c=$(field "$WORK/think_out.jsonl" content)
checks=$((checks + 1))
if [ -n "$r" ] && [ -n "$c" ] && [ "$text" = "$r</think>$c" ] &&
    grep -qF "\"content\":\"$c\",\"reasoning_content\":\"$r\"" "$WORK/think_b_out.jsonl"; then
    pass "qwen3 reasoning split: '$r' | '$c', in the own form and the chat.completion message"
else
    fail "reasoning split: text '$text', reasoning '$r', content '$c'"; cat "$WORK/think_b_out.jsonl" >&2
fi
# constructs outside the subset: refused at start-up, naming the line
printf 'ok\n{{ messages | wordcount }}\n' >"$WORK/bad.jinja"
expect_error bad_template 1 "$WORK/bad.jinja:2: the filter 'wordcount' is not supported" \
    --model "$WORK/mistral" --chat-template "$WORK/bad.jinja" "$WORK/one.jsonl"
finish
