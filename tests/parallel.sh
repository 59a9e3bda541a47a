#!/bin/sh
# Every parallel layout against one rank (tests/test_parallel.c), as one MPI
# job of 8 ranks, oversubscribed on small machines.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
exec "$MPIRUN" -q --oversubscribe --bind-to none -np 8 "$BUILD/tests/test_parallel"
