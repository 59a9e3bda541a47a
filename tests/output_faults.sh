#!/bin/sh
# Writing the results can fail at the end of a long run: a full disk must
# leave any earlier results file untouched, remove its temporary file, keep
# the journal (for --resume) and stop with one line; a temporary left by a
# run killed while writing is removed by the next run. The full disk is a
# small tmpfs (needs root and mount; skipped otherwise).
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

P=$WORK/p.jsonl
printf '{"id": "g", "prompt_token_ids": [1, 2, 3], "max_tokens": 4}\n' >"$P"

# a stale temporary of a process that no longer runs (pid 2^22 - 1 is above
# any pid the kernel hands out here unless pid_max was raised)
host=$(hostname)
stale=$WORK/stale.h5.tmp.$host.4194303
echo partial >"$stale"
expect_error stale_temporary 0 "removed $stale" --quiet --output "$WORK/stale.h5" "$P"
checks=$((checks + 1))
if [ ! -e "$stale" ] && [ -s "$WORK/stale.h5" ]; then pass "stale temporary removed, results written"
else fail "stale temporary still there or no results"; fi

mkdir -p "$WORK/full"
if ! mount -t tmpfs -o size=32k tmpfs "$WORK/full" 2>/dev/null; then
    echo "cannot mount a tmpfs here (not root?); full-disk check skipped" >&2
    [ "$failures" = 0 ] && exit 77
    finish
fi
trap 'umount "$WORK/full" 2>/dev/null; rm -rf "$WORK"' EXIT
printf 'earlier results\n' >"$WORK/full/o.h5"
expect_error full_disk 1 "No space left on device" --quiet --output "$WORK/full/o.h5" "$P"
checks=$((checks + 1))
left=$(ls "$WORK/full" | tr '\n' ' ')
# the journal stays for a --resume once there is room
if [ "$(cat "$WORK/full/o.h5")" = "earlier results" ] && [ "$left" = "o.h5 o.h5.journal.dp0 " ]; then
    pass "full_disk: earlier file untouched, no temporary left, the journal kept"
else
    fail "full_disk: folder holds '$left', o.h5 is '$(head -c 40 "$WORK/full/o.h5")'"
fi
finish
