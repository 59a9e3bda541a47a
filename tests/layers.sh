#!/bin/sh
# The layers of src/ (README "Source layout") stand on each other in one
# order: base, io, model, backend, parallel, engine, app. A file may
# include headers of its own layer and of lower ones only, so that no
# include cycle can come back.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
order="base io model backend parallel engine app"
rank() { i=0; for l in $order; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo 99; }
bad=0
for f in "$SRC"/src/*/*.[ch]; do
    layer=$(basename "$(dirname "$f")")
    for h in $(sed -n 's/^#include "\([a-z_0-9]*\)\.h".*/\1/p' "$f"); do
        [ "$h" = config ] && continue
        hdr=$(ls "$SRC"/src/*/"$h.h" 2>/dev/null | head -1)
        [ -n "$hdr" ] || continue
        hl=$(basename "$(dirname "$hdr")")
        if [ "$(rank "$hl")" -gt "$(rank "$layer")" ]; then
            fail "${f#"$SRC"/}: includes $h.h of the higher layer $hl"
            bad=$((bad + 1))
        fi
    done
done
checks=$((checks + 1))
[ "$bad" = 0 ] && pass "every include goes to the same or a lower layer ($order)"
finish
