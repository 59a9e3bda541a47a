#!/bin/sh
# A short fuzzing run of every parser (scripts/fuzz.sh), in the suite:
# DCP_FUZZ_SECONDS per target (the test script sets it for the sanitizer
# build; without it this test is skipped). Long runs: scripts/fuzz.sh 600.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
[ -n "${DCP_FUZZ_SECONDS:-}" ] || { echo "DCP_FUZZ_SECONDS not set: fuzzing skipped" >&2; exit 77; }
FUZZ_OUT=$BUILD/fuzz bash "$SRC/scripts/fuzz.sh" "$DCP_FUZZ_SECONDS"
