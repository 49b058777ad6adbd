#!/bin/sh
# tests/collective_shm.sh: the collectives battery (tests/test_collective:
# every algorithm, 2 to 8 ranks, against the serial reference, bitwise
# equal on every rank; desync; SIGKILL and SIGSTOP of a rank mid-all-reduce)
# over the shared-memory transport, all ranks on one host (N = 2..8: the
# layouts 1x2 .. 1x8, 1x4 among them), then on layouts of several hosts
# (2x2, 2x3, 3x2, 3x1: hosts x ranks per host), where the hierarchical
# all-reduces (hier, htree, hrd) run their steps between the hosts (local,
# for one host only, runs hier there); then the desync, SIGKILL and SIGSTOP
# scenarios once more with local.
top_builddir=${top_builddir:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$top_builddir/tests/test_collective" 8 shm 2x2,2x3,3x2,3x1
