#!/bin/sh
# The layouts of the GPU end-to-end test (tests/gpu_stories.sh), run on the
# CPU backend in every suite: each must be valid for its model and give the
# reference tokens, so the GPU test cannot drift to a layout the program
# refuses (it once asked for -tp 2 -dcp 2 on a model with 4 KV heads).
DCP_E2E_BACKEND=cpu exec "${SHELL:-/bin/sh}" "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/gpu_stories.sh"
