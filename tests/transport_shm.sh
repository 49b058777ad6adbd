#!/bin/sh
# tests/transport_shm.sh: the transport suite (tests/test_transport) over
# the shared-memory transport: frames, desync, kill, stop, goodbye, garbage
# and bad joins, then the segment's own checks (300 back-to-back
# operations with no segment or descriptor left; SIGKILL of every rank
# leaves nothing behind).
top_builddir=${top_builddir:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$top_builddir/tests/test_transport" shm
