#!/bin/bash
# Long-context exactness of speculative decoding (too slow for the suite,
# which runs it at 8,192 tokens): tests/spec_long.sh on a model of a
# 131,072-token context with one prompt of 100,000 tokens and 64 greedy
# tokens, without speculation and with n-gram drafts, at one rank and at
# -tp 8 -dcp 8 (8 ranks on this machine's cores): the same bits, all four.
# Prints each run's seconds and speculation line, and the checks.
#   TOKENS=100000 CONTEXT=131072
set -u
. "$(dirname "$0")/setup.sh"
ensure_packages || exit 1
build_dcpinfer || exit 1
cd "$BUILD_DIR" || exit 1
DCP_SRCDIR=$TOP DCP_BUILDDIR=$BUILD_DIR SPEC_LONG_TOKENS=${TOKENS:-100000} SPEC_LONG_CONTEXT=${CONTEXT:-131072} \
    LIMIT=${LIMIT:-7200} bash "$TOP/tests/spec_long.sh"
