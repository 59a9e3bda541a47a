#!/bin/sh
# The layers of src/ (docs/design.md "Source layout") stand on each other in
# one order: base, io, model, backend, parallel, engine, app, tools; cuda/,
# the GPU backend, is part of the backend layer. A file
# may include headers of its own layer and of lower ones only. Within a
# layer, the modules (x.c with x.h) form no include cycle either: the graph
# "x.c or x.h includes y.h" is sorted by tsort, which names any loop.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
order="base io model backend parallel engine app tools"
rank() { i=0; for l in $order; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo 99; }
bad=0
edges=$WORK/edges
: >"$edges"
# the GPU backend's folder, cuda/, stands on the backend layer: its files
# may include cuda/'s own headers and those of backend and below
layer_of() { case $1 in "$2"/cuda/*) echo backend ;; *) basename "$(dirname "$1")" ;; esac; }
node() { case $1 in "$3"/cuda/*) echo "cuda/$2" ;; *) echo "$2" ;; esac; }
# scan TOP EDGES: the includes of TOP's src/ and cuda/ into EDGES ("from
# to" by module); prints each include that goes to a higher layer
scan() {
    local top=$1 f layer mod inc h hdr to hl
    for f in "$top"/src/*/*.[ch] "$top"/cuda/*.cu "$top"/cuda/*.cuh "$top"/cuda/*.h; do
        [ -f "$f" ] || continue
        layer=$(layer_of "$f" "$top")
        mod=$(node "$f" "$(basename "$f" | sed 's/\.\(c\|h\|cu\|cuh\)$//')" "$top")
        for inc in $(sed -n 's/^#include "\([a-z_0-9]*\.c*u*h\)".*/\1/p' "$f"); do
            h=${inc%.*}
            [ "$h" = config ] && continue
            hdr=$(ls "$top"/src/*/"$inc" "$top"/cuda/"$inc" 2>/dev/null | head -1)
            [ -n "$hdr" ] || continue
            to=$(node "$hdr" "$h" "$top")
            [ "$to" != "$mod" ] && echo "$mod $to" >>"$2"
            hl=$(layer_of "$hdr" "$top")
            [ "$(rank "$hl")" -gt "$(rank "$layer")" ] && echo "${f#"$top"/}: includes $inc of the higher layer $hl"
        done
    done
}
scan "$SRC" "$edges" >"$WORK/violations"
while read -r v; do fail "$v"; bad=$((bad + 1)); done <"$WORK/violations"
checks=$((checks + 1))
[ "$bad" = 0 ] && pass "every include goes to the same or a lower layer ($order)"
checks=$((checks + 1))
loop=$(sort -u "$edges" | tsort 2>&1 >/dev/null)
if [ -z "$loop" ]; then
    pass "no include cycle among the $(sort -u "$edges" | wc -l) module dependencies of src/ and cuda/"
else
    fail "include cycle: $(echo "$loop" | tr '\n' ' ')"
fi
# the check itself: a cycle planted in the graph is found
checks=$((checks + 1))
if (sort -u "$edges"; echo "engine layer_dense"; echo "layer_dense engine") | tsort >/dev/null 2>&1; then
    fail "tsort does not report a planted cycle"
else
    pass "a planted cycle (engine <-> layer_dense) is reported"
fi
# and a planted upward include from cuda/ (a kernel file reaching into the
# engine) is reported
checks=$((checks + 1))
mkdir -p "$WORK/planted/src/engine" "$WORK/planted/cuda"
echo '#include "attention.h"' >"$WORK/planted/cuda/gemm.cu"
: >"$WORK/planted/src/engine/attention.h"
if scan "$WORK/planted" /dev/null | grep -q '^cuda/gemm.cu: includes attention.h of the higher layer engine$'; then
    pass "a planted include of the engine from cuda/ is reported"
else
    fail "an include of the engine from cuda/ goes unreported"
fi
finish
