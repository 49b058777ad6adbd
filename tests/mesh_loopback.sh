#!/bin/sh
# tests/mesh_loopback.sh: 2, 4 and 8 peers on loopback, started by meshrun,
# join the mesh and run meshbench over every pair of ranks (--all-pairs:
# ping-pong, and streaming both ways) at odd sizes from 3 bytes to 2.3 MB;
# every received byte is checked by the receiver, and any wrong byte or
# error fails the rank and so meshrun.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 9
for n in 2 4 8; do
    port=$(free_ports "$n") || { t_ok 1 "no free ports for $n peers"; continue; }
    log=$TMP/loop$n.log
    timeout 300 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
        --join-timeout 30 --all-pairs --op all -b 3 -e 3M -f 7 -n 2 -w 1 \
        > "$log" 2>&1
    rc=$?
    t_ok $rc "$n peers: meshrun + meshbench exit 0 (got $rc)"
    [ $rc -eq 0 ] || t_show "$log"
    # Rows: 2 ops x rounds x 8 sizes (3, 21, ..., 2470629), printed by rank 0.
    rounds=$(( n % 2 ? n : n - 1 ))
    rows=$(grep -Ec '^\[0\] +(pingpong|stream) ' "$log")
    t_ok $([ "$rows" -eq $((2 * rounds * 8)) ]; echo $?) \
        "$n peers: $rows table rows (want $((2 * rounds * 8)))"
    # The errors column (last) is 0 on every row.
    bad=$(grep -E '^\[0\] +(pingpong|stream) ' "$log" |
          awk '$NF != 0 { n++ } END { print n + 0 }')
    t_ok $([ "$bad" -eq 0 ] && ! grep -q 'wrong data' "$log"; echo $?) \
        "$n peers: no wrong byte on any rank ($bad rows with errors)"
done
t_done
