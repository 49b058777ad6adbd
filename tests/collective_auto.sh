#!/bin/sh
# tests/collective_auto.sh: the collectives battery (tests/test_collective)
# over "auto", the default transport: shared memory within a host and, on
# layouts of several hosts (2x2, 3x1: hosts x ranks per host), verbs'
# auto table between them (RDMA where every rank has an active port, else
# its TCP mesh; here, without RDMA, TCP: the verbs lane runs it on
# Soft-RoCE); desync, SIGKILL and SIGSTOP of a rank mid-all-reduce on one
# host and across 2 hosts of 2.
top_builddir=${top_builddir:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$top_builddir/tests/test_collective" 1 auto 2x2,3x1
