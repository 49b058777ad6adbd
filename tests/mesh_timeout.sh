#!/bin/sh
# tests/mesh_timeout.sh: --peer-timeout T bounds the silence of a dead
# peer, as meshtrain(1) documents: a peer stopped (SIGSTOP) is declared
# dead within T after it stopped (plus slack for a loaded machine), and
# never before nothing came from it for T - 1 tick (ticks of T/32, at most
# 0.1 s).
#
# 3 ranks by hand: 0 and 1 ping-pong, 2 rests, so its links carry only
# heartbeats (every 2 ticks). ss(8) gives the time since rank 2's last
# send to rank 0 (lastsnd); rank 2 is stopped once that reaches 1.5 - 2.8
# ticks, when its last sign of life is as old as it gets without a new
# heartbeat: the earliest it can be declared dead after it stopped.
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
        --secret-file "$TMP/secret" --op pingpong -b 64 -e 64 -n 1000000000 \
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

# T = 4: ticks of 0.1 s, heartbeats after 0.2 s of nothing sent
lo=150
hi=280
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
its last heartbeat to rank 0 (heartbeats every 200 ms)"

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
# The silence rank 0 measured, from its message: at least T - 1 tick.
silence=$(grep -h -o "rank 2 ([^)]*) silent for [0-9.]*" "$TMP/r0.log" |
          head -n 1 | sed 's/.* //')
# Within T of the stop: the silence rank 0 measured is T less a tick,
# plus its tick's lateness (1 s of slack); the time this script saw the
# verdict adds rank 0's reading of rank 2's last bytes and this script's
# polling, which a loaded machine delays (5 s of slack; the old rule, T +
# T/4 + 2 ticks, measured 5 to 5.5 s of silence here).
t_ok $([ -n "$took" ] && [ -n "$silence" ] &&
       awk -v s="$took" -v q="$silence" -v t=$T \
           'BEGIN { exit !(s <= t + 5 && q >= t - 0.1 - 0.005 && q <= t + 1) }'
       echo $?) \
    "rank 0 declares the stopped rank 2 dead after ${silence:-?} s of \
silence (--peer-timeout $T less a tick of 0.1 s, and within $T + 1), \
${took:-never} s after it stopped"
grep -h "rank 2 .*silent" "$TMP/r0.log" | head -n 1 | sed 's/^/# /'

# Resumed once stopped for more than T, rank 2 finds its own clock jumped
# past T: it blames itself, as its peers do, never a healthy peer for the
# silence it did not hear.
if [ -n "$stopped" ]; then
    left=$(echo "$(date +%s.%N) $t0" |
           awk -v t=$T '{ d = $2 + t + 0.5 - $1; print (d > 0 ? d : 0) }')
    sleep "$left"
fi
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
