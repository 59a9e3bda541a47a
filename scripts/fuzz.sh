#!/bin/bash
# Builds dcpinfer's fuzz targets (clang: libFuzzer + AddressSanitizer +
# UndefinedBehaviorSanitizer) and runs each for SECONDS (default 600):
#   scripts/fuzz.sh [SECONDS] [TARGET...]      targets: requests config safetensors llama2c tokjson jinja
# Each target first replays its regression inputs (tests/fuzz/regressions/
# TARGET, crash reproducers kept from earlier findings), then mutates a
# working copy of its seed corpus (tests/fuzz/corpus/TARGET) in
# $FUZZ_OUT/corpus. A crash, a hang (over 10 s for one input) or an input
# that takes over 2 GB is a finding: its reproducer is left in $FUZZ_OUT and
# the script exits 1. Exits 77 when clang or libFuzzer is missing.
set -u
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${FUZZ_OUT:-$TOP/build-fuzz}
secs=${1:-600}
shift $(($# ? 1 : 0))
targets=${*:-requests config safetensors llama2c tokjson jinja}
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null || { echo "fuzz: $CLANG not found (apt-get install clang)" >&2; exit 77; }
mkdir -p "$OUT"
SRCS="src/base/util.c src/base/weight.c src/io/requests.c src/model/hparams.c src/model/model.c src/model/arch.c src/model/family_llama.c src/model/family_deepseek.c src/model/family_moe.c src/model/mkmodel.c src/io/safetensors.c src/io/tokenizer.c src/io/hftok.c src/io/tiktoken.c src/io/jinja_value.c src/io/jinja_parse.c src/io/jinja_render.c"
findings=0
for t in $targets; do
    bin=$OUT/fuzz_$t
    if ! (cd "$TOP" && $CLANG -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -D_GNU_SOURCE -Isrc/base -Isrc/io -Isrc/model "tests/fuzz/fuzz_$t.c" $SRCS -ljansson $(pkg-config --libs libpcre2-8 libutf8proc) -lm -o "$bin") 2>"$OUT/$t.build"; then
        if grep -q "fuzzer" "$OUT/$t.build"; then
            echo "fuzz: $CLANG cannot link libFuzzer here: $(head -1 "$OUT/$t.build")" >&2; exit 77
        fi
        echo "fuzz $t: build failed"; cat "$OUT/$t.build"; findings=$((findings + 1)); continue
    fi
    reg=$TOP/tests/fuzz/regressions/$t
    if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
        if ! "$bin" "$reg"/* >"$OUT/$t.regressions.log" 2>&1; then
            echo "fuzz $t: a regression input fails again:"; grep -E "ERROR|SUMMARY|Running" "$OUT/$t.regressions.log" | tail -5
            findings=$((findings + 1)); continue
        fi
    fi
    mkdir -p "$OUT/corpus/$t"
    cp -n "$TOP/tests/fuzz/corpus/$t/"* "$OUT/corpus/$t/"
    # the real chat templates beside the checkout seed the template target too
    shared=${DCP_SHARED:-$TOP/../shared}/chat-templates
    if [ "$t" = jinja ] && [ -d "$shared" ]; then cp -n "$shared"/*.jinja "$OUT/corpus/$t/" 2>/dev/null; fi
    dict=$TOP/tests/fuzz/$t.dict
    [ -f "$dict" ] || dict=$TOP/tests/fuzz/json.dict
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 "$bin" -dict="$dict" \
        -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$OUT/$t-" "$OUT/corpus/$t" >"$OUT/$t.log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/$t.log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$OUT/$t.log")
    last=$(grep -E '^#[0-9]+.*cov:' "$OUT/$t.log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p') ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
    if [ "$rc" = 0 ]; then
        echo "fuzz $t: ${secs} s, ${runs:-?} runs, ${rate:-?} exec/s, coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corp:-?}: no finding"
    else
        findings=$((findings + 1))
        echo "fuzz $t: FINDING after ${runs:-?} runs (exit $rc); reproducer: $(ls "$OUT/$t-"* 2>/dev/null | head -1)"
        grep -E "ERROR|SUMMARY|runtime error" "$OUT/$t.log" | head -5
    fi
done
[ "$findings" = 0 ]
