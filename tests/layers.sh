#!/bin/sh
# The layers of src/ (docs/design.md "Source layout") stand on each other in
# one order: base, io, model, backend, parallel, engine, app, tools. A file
# may include headers of its own layer and of lower ones only. Within a
# layer, the modules (x.c with x.h) form no include cycle either: the graph
# "x.c or x.h includes y.h" is sorted by tsort, which names any loop.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
order="base io model backend parallel engine app tools"
rank() { i=0; for l in $order; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo 99; }
bad=0
edges=$WORK/edges
: >"$edges"
for f in "$SRC"/src/*/*.[ch]; do
    layer=$(basename "$(dirname "$f")")
    mod=$(basename "$f" | sed 's/\.[ch]$//')
    for h in $(sed -n 's/^#include "\([a-z_0-9]*\)\.h".*/\1/p' "$f"); do
        [ "$h" = config ] && continue
        hdr=$(ls "$SRC"/src/*/"$h.h" 2>/dev/null | head -1)
        [ -n "$hdr" ] || continue
        [ "$h" != "$mod" ] && echo "$mod $h" >>"$edges"
        hl=$(basename "$(dirname "$hdr")")
        if [ "$(rank "$hl")" -gt "$(rank "$layer")" ]; then
            fail "${f#"$SRC"/}: includes $h.h of the higher layer $hl"
            bad=$((bad + 1))
        fi
    done
done
checks=$((checks + 1))
[ "$bad" = 0 ] && pass "every include goes to the same or a lower layer ($order)"
checks=$((checks + 1))
loop=$(sort -u "$edges" | tsort 2>&1 >/dev/null)
if [ -z "$loop" ]; then
    pass "no include cycle among the $(sort -u "$edges" | wc -l) module dependencies of src/"
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
finish
