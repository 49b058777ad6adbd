#!/bin/sh
# tests/mesh_timeout.sh: --peer-timeout T is a lower bound. A peer stopped
# (SIGSTOP) just before its next heartbeat was due is declared dead no
# sooner than T after it stopped, and within T + T/4 + 2 ticks (plus
# slack for a loaded machine), as meshtrain(1) documents.
#
# 3 ranks by hand: 0 and 1 ping-pong, 2 rests, so its links carry only
# heartbeats (every T/4). ss(8) gives the time since rank 2's last send to
# rank 0 (lastsnd); rank 2 is stopped once that reaches 0.75 T/4 - 0.9 T/4,
# when its last sign of life is as old as it gets without a new heartbeat.
# Resumed (SIGCONT), rank 2 must blame its own stall, not a healthy peer.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

T=4
command -v ss >/dev/null 2>&1 || t_skip_all "ss (iproute2) not installed"
t_plan 3

take_ports 3 || t_skip_all "no free ports"
port=$PORT
make_secret "$TMP/secret"
for r in 0 1 2; do
    bg "$MESHBENCH" -H localhost:3 --rank $r --port "$port" \
        --secret-file "$TMP/secret" --op pingpong -b 64 -e 64 -n 1000000 \
        -w 0 --peer-timeout $T --join-timeout 30 > "$TMP/r$r.log" 2>&1
    eval "p$r=\$BG_PID"
done
joined=0
for r in 0 1 2; do
    wait_for "$TMP/r$r.log" 'joined the mesh' 30 || joined=1
done

# The milliseconds since rank 2 last sent on any connection to rank 0.
lastsnd() {
    ss -tinpH state established "( dport = :$port )" 2>/dev/null |
        awk -v pid="pid=$p2," '
            index($0, pid) { mine = 1; next }
            /^[ \t]/ && mine {
                for (i = 1; i <= NF; i++)
                    if ($i ~ /^lastsnd:/) {
                        v = substr($i, 9) + 0
                        if (best == "" || v < best) best = v
                    }
            }
            { mine = 0 }
            END { print (best == "" ? -1 : best) }'
}

lo=$((T * 1000 / 4 * 3 / 4))
hi=$((T * 1000 / 4 * 9 / 10))
stopped=""
i=0
while [ $joined -eq 0 ] && [ $i -lt 400 ]; do
    ms=$(lastsnd)
    if [ "$ms" -ge $lo ] && [ "$ms" -le $hi ]; then
        t0=$(date +%s.%N)
        kill -STOP "$p2"
        stopped=$ms
        break
    fi
    sleep 0.02
    i=$((i + 1))
done
t_ok $([ -n "$stopped" ]; echo $?) "rank 2 stopped ${stopped:-?} ms after \
its last heartbeat to rank 0 (T/4 = $((T * 250)) ms)"

took=""
if [ -n "$stopped" ]; then
    j=0
    while [ $j -lt 1000 ]; do
        if grep -q "rank 2 .*silent" "$TMP/r0.log"; then
            took=$(echo "$(date +%s.%N) $t0" | awk '{ printf "%.2f", $1 - $2 }')
            break
        fi
        sleep 0.02
        j=$((j + 1))
    done
fi
# T/4 + 2 ticks of 0.25 s is the documented excess; 5 s of slack on top.
t_ok $([ -n "$took" ] &&
       awk -v s="$took" -v t=$T 'BEGIN { exit !(s >= t && s <= t * 1.25 + 0.5 + 5) }'
       echo $?) \
    "rank 0 declares the stopped rank 2 dead ${took:-never} s after it \
stopped: not before --peer-timeout $T"
grep -h "rank 2 .*silent" "$TMP/r0.log" | head -n 1 | sed 's/^/# /'

# Resumed, rank 2 finds its own clock jumped past T: it blames itself, as
# its peers do, never a healthy peer for the silence it did not hear.
kill -CONT "$p2" 2>/dev/null
wait_exit "$p2" 15
ok=1
[ "$EXIT_CODE" -eq 3 ] &&
    grep -q "error: rank 2 (localhost:$((port + 2))) itself stood still" \
        "$TMP/r2.log" && ! grep -q "rank [01] ([^)]*) silent" "$TMP/r2.log" &&
    ok=0
t_ok $ok "resumed after SIGSTOP, rank 2 exits 3 blaming its own stall, \
not a peer (exit $EXIT_CODE)"
grep "error:" "$TMP/r2.log" | head -n 2 | sed 's/^/# /'
t_done
