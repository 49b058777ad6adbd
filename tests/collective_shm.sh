#!/bin/sh
# tests/collective_shm.sh: the collectives battery (tests/test_collective:
# every algorithm, 2 to 8 ranks, against the serial reference, bitwise
# equal on every rank; desync; SIGKILL and SIGSTOP of a rank mid-all-reduce)
# over the shared-memory transport.
top_builddir=${top_builddir:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$top_builddir/tests/test_collective" 8 shm
