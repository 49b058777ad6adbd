#!/bin/sh
# tests/mesh_flood.sh: unauthenticated clients must not keep peers out.
# 256 idle connections to rank 0, each reopened the moment it is dropped
# (tests/flood.py idle), while rank 1 joins: rank 1 must get through well
# within --join-timeout (OpenSSH MaxStartups-style limits, per source and
# in all, that idle clients cannot outnumber a peer's handshake in).
# Then a connect flood against a joined rank (tests/flood.py churn, 5 s):
# its refusals are logged a few lines per source and 10 s, then counted
# ("... and 12,345 more from 127.0.0.1 in the last 10 s").
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

command -v python3 >/dev/null 2>&1 || t_skip_all "python3 not installed"
FLOOD="python3 $top_srcdir/tests/flood.py"
JT=10
t_plan 3

take_ports 2 || t_skip_all "no free ports"
port=$PORT
make_secret "$TMP/secret"
RUN="--secret-file $TMP/secret --op pingpong -b 8 -e 8 -n 2 -w 0 \
--join-timeout $JT"
# shellcheck disable=SC2086
bg "$MESHBENCH" -H localhost:2 --rank 0 --port "$port" $RUN \
    > "$TMP/idle0.log" 2>&1
p0=$BG_PID
# the flood against rank 0's listening port, and rank 1 only once the 256
# are open (fixed sleeps of 0.3 and 1 s let rank 1 in before the flood
# on a loaded machine, or flood a port not yet open)
if command -v ss >/dev/null 2>&1; then
    i=0
    while [ $i -lt 300 ] &&
          [ -z "$(ss -ltnH "( sport = :$port )" 2>/dev/null)" ]; do
        sleep 0.1
        i=$((i + 1))
    done
else
    sleep 0.3
fi
bg $FLOOD idle 127.0.0.1 "$port" 256 $((JT + 2)) > "$TMP/idle.flood" 2>&1
fl=$BG_PID
wait_for "$TMP/idle.flood" '^idle: [0-9]+ opened' 30
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

take_ports 2 || t_skip_all "no free ports"
port=$PORT
for r in 0 1; do
    bg "$MESHBENCH" -H localhost:2 --rank $r --port "$port" \
        --secret-file "$TMP/secret" --op pingpong -b 64 -e 64 -n 1000000000 \
        -w 0 --join-timeout 30 > "$TMP/churn$r.log" 2>&1
done
wait_for "$TMP/churn0.log" 'joined the mesh' 30
$FLOOD churn 127.0.0.1 "$port" 5 > "$TMP/churn.flood" 2>&1
sed 's/^/# /' "$TMP/churn.flood"
wait_for "$TMP/churn0.log" 'more from 127\.0\.0\.1 in the last' 15
n=$(grep -c "refused" "$TMP/churn0.log")
made=$(sed -n 's/^churn: \([0-9]*\) connections/\1/p' "$TMP/churn.flood")
t_ok $([ "${made:-0}" -ge 1000 ] && [ "$n" -le 20 ]; echo $?) \
    "a connect flood (${made:-no} connections) is logged in $n lines, not \
one per connection"
t_ok $(grep -Eq "\.\.\. and [0-9,]+ more from 127\.0\.0\.1 in the last 1[0-9] s" \
       "$TMP/churn0.log"; echo $?) "the rest is counted per source and window"
grep "more from 127" "$TMP/churn0.log" | head -n 1 | cut -c1-200 | sed 's/^/# /'
t_done
