#!/bin/sh
# tests/mesh_flood.sh: unauthenticated clients must not keep peers out.
# 256 idle connections to rank 0, each reopened the moment it is dropped
# (tests/flood.py idle), while rank 1 joins: rank 1 must get through well
# within --join-timeout (OpenSSH MaxStartups-style limits, per source and
# in all, that idle clients cannot outnumber a peer's handshake in).
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

command -v python3 >/dev/null 2>&1 || t_skip_all "python3 not installed"
FLOOD="python3 $top_srcdir/tests/flood.py"
JT=10
t_plan 1

take_ports 2 || t_skip_all "no free ports"
port=$PORT
make_secret "$TMP/secret"
RUN="--secret-file $TMP/secret --op pingpong -b 8 -e 8 -n 2 -w 0 \
--join-timeout $JT"
# shellcheck disable=SC2086
bg "$MESHBENCH" -H localhost:2 --rank 0 --port "$port" $RUN \
    > "$TMP/idle0.log" 2>&1
p0=$BG_PID
sleep 0.3
bg $FLOOD idle 127.0.0.1 "$port" 256 $((JT + 2)) > "$TMP/idle.flood" 2>&1
fl=$BG_PID
sleep 1
# shellcheck disable=SC2086
bg "$MESHBENCH" -H localhost:2 --rank 1 --port "$port" $RUN \
    > "$TMP/idle1.log" 2>&1
p1=$BG_PID
wait_exit "$p1" $((JT + 10))
rc1=$EXIT_CODE
wait_exit "$p0" $((JT + 10))
rc0=$EXIT_CODE
kill "$fl" 2>/dev/null
wait "$fl" 2>/dev/null
t_ok $([ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]; echo $?) \
    "256 idle clients reconnecting at once: rank 1 still joins rank 0 \
(exit $rc0 $rc1 after ${EXIT_AFTER}s)"
[ "$rc1" -eq 0 ] || t_show "$TMP/idle1.log" 3
t_done
