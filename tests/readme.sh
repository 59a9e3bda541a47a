#!/bin/bash
# The README's commands run as written. Every ```sh block of its "Quick
# start" and "Running" sections is run, in order and in one shell, in a
# copy of the checkout (its tracked and untracked files, no build
# products: as a fresh clone), with ../shared beside it and a fresh HOME:
# as root (the current user, when root), then as a normal user on the same
# copy. A command that fails fails the test. The one command not run is
# `scripts/test.sh`: this test is part of its run.
# Standalone: DCP_SHARED=../shared bash tests/readme.sh
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

if [ ! -f "$SHARED/models/stories260K/stories260K.bin" ]; then
    echo "readme.sh: the README's examples use ../shared/models/stories260K, not found under $SHARED: skipped" >&2
    exit 77
fi

# the blocks, from the README as it is
awk '/^## / { section = $0 } /^```/ { if (inblock) { inblock = 0; next } if ($0 == "```sh" && (section == "## Quick start" || section == "## Running")) { inblock = 1; printf "# --- block %d (%s)\n", ++n, section; next } } inblock' \
    "$SRC/README.md" >"$WORK/blocks.sh"
nblocks=$(grep -c '^# --- block' "$WORK/blocks.sh")
skipped=$(grep -cE '^[^#]*scripts/test\.sh' "$WORK/blocks.sh")
# scripts/test.sh runs this test: it is left out here (CI runs it for real)
sed -E 's@^([^#]*scripts/test\.sh.*)$@: not run here, this test is part of it: \1@' "$WORK/blocks.sh" >"$WORK/readme-commands.sh"

checks=$((checks + 1))
if [ "$nblocks" -ge 5 ] && [ "$skipped" = 1 ] && grep -q 'scripts/demo.sh' "$WORK/readme-commands.sh"; then
    pass "README: $nblocks shell blocks in Quick start and Running ($skipped command left out: scripts/test.sh)"
else
    fail "README: $nblocks blocks, $skipped scripts/test.sh lines"; cat "$WORK/blocks.sh" >&2
fi

# a fresh clone: the checkout's files without build products
mkdir -p "$WORK/clone/dcpinfer"
(cd "$SRC" && git ls-files -co --exclude-standard -z | xargs -0 tar cf - 2>/dev/null) | tar xf - -C "$WORK/clone/dcpinfer"
ln -s "$(cd "$SHARED" && pwd)" "$WORK/clone/shared"
chmod 755 "$WORK"

run_blocks() { # NAME [USER]: the README's commands in the clone, HOME fresh; log in $WORK/NAME.log
    local name=$1 user=${2:-} home=$WORK/home-$1
    mkdir -p "$home"
    local env=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$home" LANG=C.UTF-8
        DCP_SHARED="$WORK/clone/shared")
    if [ -n "$user" ]; then
        chown -R "$user" "$WORK/clone/dcpinfer" "$home"
        (cd "$WORK/clone/dcpinfer" && runuser -u "$user" -- "${env[@]}" USER="$user" bash -ex "$WORK/readme-commands.sh") \
            >"$WORK/$name.log" 2>&1
    else
        (cd "$WORK/clone/dcpinfer" && "${env[@]}" bash -ex "$WORK/readme-commands.sh") >"$WORK/$name.log" 2>&1
    fi
}

check_run() { # NAME RC: every command succeeded, left what it says and printed no binding note
    local name=$1 rc=$2 home=$WORK/home-$1 missing=""
    checks=$((checks + 1))
    for f in runs/demo.h5 runs/plain.h5 runs/stories.h5 runs/tp8-dcp2.h5 runs/tp2-dp4.h5 runs/mqa.h5 runs/long.h5 \
        demo-out/demo.h5 demo-out/stories.h5; do
        [ -s "$WORK/clone/dcpinfer/$f" ] || missing="$missing $f"
    done
    [ -x "$home/.local/bin/dcpinfer" ] || missing="$missing \$HOME/.local/bin/dcpinfer"
    # the README's Open MPI settings leave a rank unbound: no note that a
    # rank was bound to fewer cores than its share
    grep -q 'is bound to' "$WORK/$name.log" && missing="$missing (a binding note: $(grep -m1 'is bound to' "$WORK/$name.log"))"
    if [ "$rc" = 0 ] && [ -z "$missing" ] && grep -q '# 5 request(s), 0 failed' "$WORK/$name.log"; then
        pass "README as $name: every command ran, results in runs/ and demo-out/, dcpinfer installed in \$HOME/.local/bin"
    else
        fail "README as $name: exit status $rc, missing:$missing; the end of its log:"
        tail -25 "$WORK/$name.log" | sed 's/^/    /' >&2
    fi
    rm -rf "$WORK/clone/dcpinfer/runs" "$WORK/clone/dcpinfer/demo-out"
}

me=$(id -un)
run_blocks "$me"
check_run "$me" $?

# as a normal user too, when this test runs as root (as CI does)
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null; then
    id dcpreadme >/dev/null 2>&1 || useradd --system --no-create-home --shell /bin/bash dcpreadme
    run_blocks user dcpreadme
    check_run user $?
    chown -R 0:0 "$WORK/clone"
fi
finish
