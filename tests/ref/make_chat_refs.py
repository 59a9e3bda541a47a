#!/usr/bin/env python3
"""Reference for dcpinfer's chat templates (not run by the test suite):
jinja2 configured exactly as transformers configures it for
apply_chat_template (its own compile function), and transformers'
apply_chat_template itself for the real templates.

Writes
- tests/data/chat/jinja-cases.jsonl: small templates, one feature each
  (whitespace control, trim_blocks/lstrip_blocks, filters, tests, methods,
  slices, macros, loops, Python's str() and json.dumps), with their
  variables and jinja2's output, or "error": true where jinja2 fails;
- tests/data/chat/requests-TOKENIZER.jsonl and .ids: the Llama 3.1 and
  Qwen3 conversations as dcpinfer request lines, and per line the prompt
  ids apply_chat_template gives (tests/chat.sh runs them end to end);
- tests/data/chat/templates.jsonl: every template in
  ../shared/chat-templates x the conversations below, with the rendered
  text and the prompt ids of apply_chat_template(tokenize=True) with the
  tokenizer named (a tokenizer.json from ../shared/tokenizers; for Kimi K2,
  the cl100k ranks with Kimi's pattern and special tokens, as
  make_tiktoken_refs.py builds it, encoded by tiktoken).
tests/test_chat.c reads jinja-cases.jsonl and templates.jsonl.

Usage: python3 tests/ref/make_chat_refs.py [SHARED_DIR]
(needs transformers >= 5, jinja2 and tiktoken; no torch)
"""
import json
import os
import sys

from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_tok import kimi_encoding  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(TOP), "shared")
OUT = os.path.join(TOP, "tests", "data", "chat")

MSGS = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]

# (template, variables): one feature each
CASES = [
    ("a {{ x }} b", {"x": "X"}),
    ("{{ x }}|{{ y }}|{{ z }}|{{ w }}", {"x": None, "y": True, "z": 1.5, "w": [1, "a", None, {"k": [True]}]}),
    ("{{ undefined_thing }}.", {}),
    ("{{ 1e20 }} {{ 1e-7 }} {{ 0.1 + 0.2 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 100.0 * 3 }}", {}),
    ("{{ 12345678901234567.0 }} {{ 1e16 }} {{ 123456789012345.6 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing }}", {}),
    ("{{ 'it''s' }} {{ \"q\\\"uote\" }} {{ 'tab\\tnl\\n' }} {{ '\\u00e9\\x41' }}", {}),
    ("{{ [1, 2, 3][1:] }} {{ 'hello'[::-1] }} {{ [1,2,3,4,5][::2] }} {{ 'abc'[-1] }} {{ [1,2,3][-2:] }} {{ 'héllo'[1:3] }} {{ [1,2,3][5:] }} {{ [1,2,3,4][3:0:-1] }}", {}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"a": 0, "b": ""}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"a": 0, "b": "x"}),
    ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}:{{ x }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for k, v in d | items %}{{ k }}={{ v }},{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("{% for c in 'héé' %}[{{ c }}]{% endfor %}", {}),
    ("{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.last }},{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for x in range(3) %}{{ x }}{% endfor %}{% for x in range(1, 10, 3) %}{{ x }}{% endfor %}{% for x in range(5, 0, -2) %}{{ x }}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(x=1, items=[]) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", {}),
    ("{% set ns = namespace() %}{% set ns.a = 'b' %}{{ ns.a }}{{ ns.missing is defined }}", {}),
    ("{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]", {}),
    ("{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}", {}),
    ("{% macro m(x) -%}\n  [{{ x }}]\n{%- endmacro %}{{ m('a') }}{{ m('b') }}", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body{% endcall %}", {}),
    ("{% macro wrap() %}<{{ caller(5) }}>{% endmacro %}{% call(n) wrap() %}n={{ n }}{% endcall %}", {}),
    ("{{ s | length }} {{ xs | length }} {{ d | length }} {{ none_thing | length }}", {"s": "héllo", "xs": [1, 2], "d": {"a": 1}}),
    ("[{{ '  a b \\n' | trim }}] [{{ 'xxaxx' | trim('x') }}] [{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ s.strip('\\n ') }}]", {"s": " \n hi \n "}),
    ("{{ 'aXb' | lower }} {{ 'aXb' | upper }} {{ 'aXb'.lower() }} {{ 'aXb'.upper() }}", {}),
    ("{{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'ab'.replace('', '.') }}", {}),
    ("{{ xs | join(', ') }} {{ xs | join }} {{ [1, none, 2.5] | join('/') }}", {"xs": ["a", "b"]}),
    ("{{ xs | first }} {{ xs | last }} {{ 'abc' | first }} {{ [] | first }}.", {"xs": [1, 2, 3]}),
    ("{{ x | default('D') }} {{ y | default('D') }} {{ z | default('D', true) }} {{ z | d('E') }}", {"y": "Y", "z": ""}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | list | length }} {{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }} {{ ms | selectattr('content') | list | length }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": ""}]}),
    ("{{ xs | reject('equalto', 'b') | join }} {{ xs | select('equalto', 'b') | join }} {{ [0, 1, 2] | select | list }}", {"xs": ["a", "b", "c"]}),
    ("{{ x | tojson }} {{ x | tojson(indent=2) }} {{ x | tojson(sort_keys=true) }} {{ x | tojson(separators=(',', ':')) }} {{ x | tojson(ensure_ascii=true) }}",
     {"x": {"b": [1, 2.5, None, True, "é\"\\\n\t\u0001😀"], "a": {}, "c": []}}),
    ("{{ 'é' | tojson }} {{ 1.0 | tojson }} {{ 10000000000000000.0 | tojson }} {{ none | tojson }} {{ 'x' | tojson(indent=4) }}", {}),
    ("{{ x | tojson(indent='\\t') }}", {"x": [1, {"a": [2]}]}),
    ("{{ x is defined }}{{ y is defined }}{{ y is none }}{{ x is string }}{{ 1 is number }}{{ true is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is integer }}", {"x": "a", "y": None}),
    ("{{ d is mapping }}{{ xs is mapping }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ xs is sequence }}{{ u is iterable }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'cat' }}",
     {"d": {}, "xs": [1]}),
    ("{{ 1 is equalto 1 }}{{ 1 is eq(1.0) }}{{ 'a' is not equalto 'b' }}{{ x is not defined }}", {}),
    ("{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' x  y '.split(none, 1) }}", {}),
    ("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.endswith('x') }}", {}),
    ("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", {"d": {"a": 1, "b": [2]}}),
    ("{{ d.a }} {{ d['a'] }} {{ d.missing }}. {{ d['missing'] }}. {{ xs[5] }}. {{ xs.0 }}", {"d": {"a": 1}, "xs": [7]}),
    ("{{ 1 if x else 2 }} {{ 1 if y else 2 }} {{ (1 if y) is defined }}", {"x": 1, "y": 0}),
    ("{{ x or 'o' }} {{ x and 'a' }} {{ 'p' or x }} {{ not x }} {{ not not 'q' }}", {"x": ""}),
    ("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'cat' }}", {}),
    ("{{ [1] + [2] }} {{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ [0] * 2 }} {{ -x }} {{ 1 + 2 * 3 - 4 / 2 }} {{ (1, 2) }} {{ (1,) }}", {"x": 5}),
    ("{{ d == e }} {{ d == f }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ u == v }}", {"d": {"a": 1, "b": 2}, "e": {"b": 2, "a": 1}, "f": {"a": 1}}),
    ("{{ 'x' + xs | length | string }} {{ xs | length - 1 }} {{ ['a','b'] | join('-') | upper }}", {"xs": [1, 2, 3]}),
    ("{{ ['it\\'s', \"q\\\"\", 'a\\nb', 'é'] }} {{ {'k': 'v', 1: none} }}", {}),
    ("{{ s[:-1] }}|{{ s[1:] }}|{{ s[-3:-1] }}", {"s": "{\"a\": 1}"}),
    # whitespace control and trim_blocks/lstrip_blocks
    ("line1\n  {% if true %}\n    body\n  {% endif %}\nline2\n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("a\n{{- 'x' -}}\nb", {}),
    ("  {%+ if true %}x{% endif %}\n", {}),
    ("a {# comment #}\nb\n  {# indented comment #}\nc {#- strip -#}   d", {}),
    ("{% if true %}\nx\n{%+ endif %}y", {}),
    ("{% for x in [1, 2] %}\n  - {{ x }}\n{% endfor %}\n", {}),
    ("\t{% if true %}tab{% endif %}", {}),
    ("x\r\ny\r\n{% if true %}\r\nz{% endif %}\n\n", {}),
    ("{{ 'a' }}   {% if true %}b{% endif %}", {}),
    ("{{- 'a' }}\n   \n{%- set x = 1 %}\n{{ x }}", {}),
    ("{% if true -%}\n\n  x{%- endif %}\n", {}),
    ("{{ '\u3000x\u3000' | trim }}|{{ 'x\u00a0' | trim }}", {}),
    # errors jinja2 raises
    ("{{ raise_exception('Bad role: ' + r) }}", {"r": "tool"}),
    ("{{ x.y }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ none + 1 }}", {}),
    ("{{ u + 1 }}", {}),
    ("{% set xs = [] %}{{ xs.append(1) }}", {}),
    ("{{ range(1000000) | length }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ x | tojson }}", {}),
    ("{{ none.startswith('a') }}", {}),
    ("{% for a, b in [1, 2] %}{% endfor %}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
    ("{% set ns = namespace(_x=1) %}", {}),
    ("{% set x = 1 %}{% set x.y = 2 %}", {}),
    ("{{ messages[0]['content'] }}", {"messages": []}),
    # real-template idioms
    ("{% for message in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}{{ index }}{{ message.role }}{% endfor %}", {"messages": MSGS}),
    ("{%- set content = m.content.split('</think>')[-1].lstrip('\\n') %}[{{ content }}]{{ m.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     {"m": {"content": "<think>\nreason\n</think>\n\nanswer"}}),
    ("{{ m.get('name') or m['role'] }} {{ m.get('content') is string }}", {"m": {"role": "user", "content": "x"}}),
    ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ add_generation_prompt }}", {}),
    ("{{ (ns.index % 2 == 0) }} {{ (m['role'] == 'user') != (1 % 2 == 0) }}", {"ns": {"index": 3}, "m": {"role": "user"}}),
    ("{{ x | string }} {{ 5 | string }} {{ none | string }}", {"x": [1, "a"]}),
    ("{{ strftime_now('%Y') | length }}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("{{ 'a' 'b' }} {{ 1_000 }} {{ 2e3 }}", {}),
    ("{{ {'a': 1, 'b': {'c': [1, 2]}} | tojson }} {{ [] | tojson }} {{ {} | tojson(indent=2) }}", {}),
    ("{% for x in xs %}{{ loop.previtem }}>{{ loop.nextitem }};{% endfor %}", {"xs": [1, 2, 3]}),
    ("{{ xs | map(attribute='a.b') | list }} {{ xs | map(attribute='a.c') | list }}", {"xs": [{"a": {"b": 1}}, {"a": {"b": 2}}]}),
    ("{% for k, v in x.items() %}{{ k }}{% endfor %}{{ x['items'] }}", {"x": {"items": 5}}),
    ("{{ 'abc'.split('') }}", {}),
    # macros: varargs and kwargs where the body names them, a macro's name and repr
    ('{% macro f(a, b="d", c=none) %}{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1) }}', {}),
    ('{% macro f(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, x=4, y="s") }}', {}),
    ('{% macro f(a) %}{{ a }}{% if false %}{{ kwargs }}{% endif %}{% endmacro %}{{ f(1, x=2) }}', {}),
    ('{% macro f(a) %}{{ a }}{{ kwargs }}{% endmacro %}{{ f(1, 2) }}', {}),
    ('{% macro f(a) %}{{ a }}{{ varargs }}{% endmacro %}{{ f(1, x=2) }}', {}),
    ('{% macro f() %}x{% endmacro %}{{ f.name }}{{ f }}', {}),
    ('{% macro w() %}{{ caller }}{{ caller.name }}{% endmacro %}{% call w() %}b{% endcall %}', {}),
    ('{% macro f(a, a) %}{% endmacro %}', {}),
    # Python's methods that the engine lacks are defined (jinja2 finds them); a missing one is not
    ("{% if messages[0].content.title is defined %}T{% else %}F{% endif %}", {"messages": MSGS}),
    ("{{ 'abc'.title is defined }}{{ {}.copy is defined }}{{ [].index is defined }}{{ 'abc'.nosuch is defined }}", {}),
    ("{{ 'abc'.nosuch() }}", {}),
    # numbers and json.dumps as Python has them
    ("{{ [1, {'a': 2}] | tojson(indent=100) }}", {}),
    ("{{ 0 ** -1 }}", {}),
    ("{{ 0.0 ** -2.5 }}", {}),
    ("{{ 2 ** -1 }} {{ 4 ** 0.5 }}", {}),
    # refused at parse time
    ("{{ dict(a=1, a=2) }}", {}),
    ("{% for x in [1] %}{% set loop = 5 %}{% endfor %}", {}),
    ("{% for loop in [1] %}{% endfor %}", {}),
    ("{% set loop = 5 %}{{ loop }}", {}),
    # unknown filters and tests: at parse time outside an if or a conditional
    # expression, when evaluated inside one (a for loop, macro or set block
    # inside the if is outside again)
    ("{% if false %}{{ x | from_json }}{% endif %}ok", {}),
    ("{% if true %}{{ '[1]' | from_json }}{% endif %}ok", {}),
    ("{% if x | from_json %}{% endif %}ok", {"x": "1"}),
    ("{% if false %}x{% elif false %}{{ 1 is nosuchtest }}{% else %}y{% endif %}ok", {}),
    ("{% if false %}x{% else %}{{ 1 | from_json }}{% endif %}ok", {}),
    ("{% if false %}{% for i in [1] %}{{ i | from_json }}{% endfor %}{% endif %}ok", {}),
    ("{% if false %}{% macro m() %}{{ 1 | from_json }}{% endmacro %}{% endif %}ok", {}),
    ("{% if false %}{% set y %}{{ 1 | from_json }}{% endset %}{% endif %}ok", {}),
    ("{% if false %}{% set y = 1 | from_json %}{% endif %}ok", {}),
    ("{{ (1 | from_json) if false else 2 }} {{ 3 if false else 4 | from_json }}", {}),
    ("{{ 1 | from_json if true else 2 }}", {}),
    ("{% for x in [1] %}{% if false %}{{ 1 | from_json }}{% endif %}{% endfor %}ok", {}),
    ("{{ 1 | from_json }}{% if false %}{% endif %}", {}),
    ("{{ f(1 | from_json) if false }}ok", {}),
    # a tool branch as DeepSeek-V3.2's template has it: arguments parsed from
    # JSON only when a message carries tool calls
    ("{%- for m in messages %}{%- if m.tool_calls is defined and m.tool_calls %}{%- for t in m.tool_calls %}"
     "{{ (t.function.arguments | from_json) | tojson }}{%- endfor %}{%- else %}{{ m.role }}: {{ m.content }}\n"
     "{%- endif %}{%- endfor %}", {"messages": MSGS}),
]


def render_case(template, variables):
    """jinja2's output, or its error and when it came: "parse" (compiling
    the template) or "render" """
    try:
        compiled = _compile_jinja_template(template)
    except Exception as e:  # noqa: BLE001 - any jinja2 failure is the expected outcome
        return {"error": True, "at": "parse", "message": str(e)}
    try:
        return {"out": compiled.render(**variables)}
    except Exception as e:  # noqa: BLE001
        return {"error": True, "at": "render", "message": str(e)}


def conversations():
    """(name, messages, options): multi-turn, with and without a system
    message, empty contents, unicode, thinking on and off, continue_final_message"""
    sys_msg = {"role": "system", "content": "You are a careful assistant.\nAnswer briefly."}
    uni = "Ünïcödé — 日本語のテキスト, emoji 😀👍🏽, Arabic مرحبا, tabs\tand  spaces"
    return [
        ("single", [{"role": "user", "content": "What is 2 + 2?"}], {}),
        ("system", [sys_msg, {"role": "user", "content": "Name a prime."}], {}),
        ("multi", [sys_msg, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}], {}),
        ("multi-nosys", [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
                         {"role": "user", "content": "Three"}, {"role": "assistant", "content": "Four"},
                         {"role": "user", "content": "Five?"}], {}),
        ("empty", [{"role": "user", "content": ""}], {}),
        ("empty-turns", [sys_msg, {"role": "user", "content": "x"}, {"role": "assistant", "content": ""},
                         {"role": "user", "content": " "}], {}),
        ("unicode", [{"role": "system", "content": uni}, {"role": "user", "content": uni}], {}),
        ("thinking-on", [{"role": "user", "content": "Think about it."}], {"chat_template_kwargs": {"enable_thinking": True}}),
        ("thinking-off", [{"role": "user", "content": "Answer now."}], {"chat_template_kwargs": {"enable_thinking": False}}),
        ("reasoning-history", [{"role": "user", "content": "Q1"},
                               {"role": "assistant", "content": "<think>\nfirst I add\n</think>\n\nA1"},
                               {"role": "user", "content": "Q2"}], {}),
        ("no-generation-prompt", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
         {"add_generation_prompt": False}),
        ("continue", [{"role": "user", "content": "Write a poem."}, {"role": "assistant", "content": "Roses are"}],
         {"add_generation_prompt": False, "continue_final_message": True}),
    ]


TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "Qwen-Qwen3-0.6B.jinja": "qwen3",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "qwen3",
    "deepseek-ai-DeepSeek-V3.1.jinja": "qwen3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral-sp",
    "Kimi-K2-Instruct.jinja": "kimi-cl100k",
}


# templates run end to end through dcpinfer (tests/chat.sh)
END_TO_END = ("meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja")


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "jinja-cases.jsonl"), "w", encoding="utf-8") as f:
        for template, variables in CASES:
            f.write(json.dumps({"template": template, "vars": variables, **render_case(template, variables)},
                               ensure_ascii=False) + "\n")
    toks, e2e = {}, {}
    with open(os.path.join(OUT, "templates.jsonl"), "w", encoding="utf-8") as f:
        for file, tok in TEMPLATES.items():
            template = open(os.path.join(SHARED, "chat-templates", file), encoding="utf-8").read()
            if tok not in toks:
                toks[tok] = kimi_encoding(SHARED) if tok == "kimi-cl100k" else PreTrainedTokenizerFast.from_pretrained(
                    os.path.join(SHARED, "tokenizers", tok))
            t = toks[tok]
            # what apply_chat_template passes: the tokenizer's special tokens
            specials = {"bos_token": "[BOS]", "eos_token": "[EOS]"} if tok == "kimi-cl100k" else t.special_tokens_map
            for name, messages, opts in conversations():
                kwargs = opts.get("chat_template_kwargs", {})
                agp = opts.get("add_generation_prompt", True)
                cont = opts.get("continue_final_message", False)
                rec = {"template": file, "tokenizer": tok, "conversation": name, "messages": messages,
                       "add_generation_prompt": agp, "continue_final_message": cont, "chat_template_kwargs": kwargs,
                       "special_tokens": specials}
                try:
                    rendered, _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=agp,
                                                        continue_final_message=cont, **specials, **kwargs)
                    text = rendered[0]
                    if tok == "kimi-cl100k":
                        ids = t.encode(text, allowed_special="all")
                    else:
                        ids = t.apply_chat_template(messages, chat_template=template, tokenize=True,
                                                    add_generation_prompt=agp, continue_final_message=cont,
                                                    return_dict=False, **kwargs)
                        if isinstance(ids, dict):
                            ids = ids["input_ids"]
                        assert ids == t.encode(text, add_special_tokens=False), (file, name)
                    rec.update(text=text, ids=ids)
                except Exception as e:  # noqa: BLE001
                    rec.update(error=str(e))
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                if file in END_TO_END and "ids" in rec:
                    req = {"id": name, "messages": messages, "add_generation_prompt": agp,
                           "continue_final_message": cont, "max_tokens": 1, "temperature": 0}
                    if kwargs:
                        req["chat_template_kwargs"] = kwargs
                    e2e.setdefault(tok, []).append((req, rec["ids"]))
    for tok, items in e2e.items():
        with open(os.path.join(OUT, "requests-%s.jsonl" % tok), "w", encoding="utf-8") as f:
            for req, _ in items:
                f.write(json.dumps(req, ensure_ascii=False) + "\n")
        with open(os.path.join(OUT, "requests-%s.ids" % tok), "w") as f:
            for _, ids in items:
                f.write(",".join(map(str, ids)) + "\n")


if __name__ == "__main__":
    main()
