#!/bin/sh
# tests/mesh_kill.sh: one of 4 peers dies (SIGKILL) or freezes (SIGSTOP),
# with peers started by hand and under meshrun. The survivors must exit
# with code 3 (peer failure) within the bound, naming the culprit's rank
# and host:port; meshrun must stop the rest, exit non-zero and name the
# culprit.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

PEER_TIMEOUT=2
# Survivors must be gone within the peer timeout plus this much slack (a
# loaded 2-core machine runs other tests at the same time).
SLACK=10
VICTIM=2
# A workload that runs for minutes unless something fails.
WORK="--op pingpong -b 64 -e 64 -n 1000000000 -w 0 --peer-timeout $PEER_TIMEOUT \
--join-timeout 30"

t_plan 15

# by_hand SIGNAL: 4 peers started by hand; SIGNAL the victim.
by_hand() {
    sig=$1
    take_ports 4 || { t_ok 1 "free ports"; return; }
    port=$PORT
    secret=$TMP/secret
    make_secret "$secret"
    pids=""
    for r in 0 1 2 3; do
        # shellcheck disable=SC2086
        bg "$MESHBENCH" -H localhost:4 --rank $r --port "$port" \
            --secret-file "$secret" $WORK > "$TMP/hand$r.log" 2>&1
        pids="$pids $BG_PID"
    done
    set -- $pids
    joined=0
    for r in 0 1 2 3; do
        wait_for "$TMP/hand$r.log" 'joined the mesh' 30 || joined=1
    done
    t_ok $joined "by hand: 4 peers joined (SIG$sig test)"
    eval victim=\${$((VICTIM + 1))}
    kill -"$sig" "$victim"
    all=0
    r=0
    for p in $pids; do
        if [ $r -ne $VICTIM ]; then
            wait_exit "$p" $((PEER_TIMEOUT + SLACK))
            if [ "$EXIT_CODE" -ne 3 ] ||
               ! grep -q "rank $VICTIM" "$TMP/hand$r.log" ||
               ! grep -q ":$((port + VICTIM))" "$TMP/hand$r.log"; then
                all=1
                t_diag "rank $r: exit $EXIT_CODE after ${EXIT_AFTER}s"
                t_show "$TMP/hand$r.log" 5
            fi
        fi
        r=$((r + 1))
    done
    t_ok $all "by hand, SIG$sig of rank $VICTIM: the 3 survivors exit 3 \
within ${PEER_TIMEOUT}+${SLACK}s naming rank $VICTIM and port $((port + VICTIM))"
    grep -h "rank $VICTIM" "$TMP"/hand[013].log | head -n 3 | sed 's/^/# /'
    kill -KILL "$victim" 2>/dev/null
    wait "$victim" 2>/dev/null
}

under_meshrun() {
    sig=$1
    take_ports 4 || { t_ok 1 "free ports"; return; }
    port=$PORT
    log=$TMP/run$sig.log
    # shellcheck disable=SC2086
    bg "$MESHRUN" -np 4 --grace 2 -- "$MESHBENCH" --port "$port" $WORK \
        > "$log" 2>&1
    mr=$BG_PID
    i=0
    while [ "$(grep -c 'joined the mesh' "$log")" -lt 4 ] && [ $i -lt 300 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    t_ok $([ $i -lt 300 ]; echo $?) "meshrun: 4 ranks joined (SIG$sig test)"
    victim=$(rank_pid "$mr" $VICTIM)
    t_ok $? "meshrun: found rank $VICTIM's pid ($victim)"
    [ -n "$victim" ] && kill -"$sig" "$victim"
    wait_exit "$mr" $((PEER_TIMEOUT + SLACK + 2))
    t_ok $([ "$EXIT_CODE" -ne 0 ] && [ "$EXIT_CODE" -ne 255 ]; echo $?) \
        "meshrun exits non-zero in time after SIG$sig of rank $VICTIM \
(code $EXIT_CODE after ${EXIT_AFTER}s)"
    if [ "$sig" = KILL ]; then
        t_ok $([ "$EXIT_CODE" -eq 137 ] &&
               grep -q "rank $VICTIM (localhost) was killed by signal 9" \
                    "$log"; echo $?) \
            "meshrun exits 137, the killed rank's status, and says which"
    else
        t_ok $([ "$EXIT_CODE" -eq 3 ] &&
               grep -Eq "^\[[013]\] .*rank $VICTIM" "$log" &&
               grep -q "^meshrun: rank $VICTIM (localhost) failed the job" \
                    "$log"; echo $?) \
            "meshrun exits 3, the survivors' code, and names rank $VICTIM, \
the culprit they name"
    fi
    [ "$EXIT_CODE" -eq 0 ] || grep -E "^meshrun|error" "$log" |
        head -n 4 | sed 's/^/# /'
    left=$(ps -o pid= --ppid "$mr" 2>/dev/null | wc -l)
    gone=0
    [ -n "$victim" ] && kill -0 "$victim" 2>/dev/null && gone=1
    t_ok $gone "meshrun left no rank running ($left children)"
}

# A peer that never starts: the join fails at --join-timeout with exit 2,
# naming the ranks that never answered.
take_ports 3
port=$PORT
"$MESHBENCH" -H localhost:3 --rank 0 --port "$port" --insecure \
    --join-timeout 2 > "$TMP/join.log" 2>&1 &
jp=$!
T_PIDS="$T_PIDS $jp"
wait_exit $jp 15
t_ok $([ "$EXIT_CODE" -eq 2 ] &&
       grep -q "rank 1 (localhost:$((port + 1)))" "$TMP/join.log" &&
       grep -q "rank 2 (localhost:$((port + 2)))" "$TMP/join.log"; echo $?) \
    "peers never started: exit 2 after the join timeout, naming ranks 1 and \
2 with host:port (exit $EXIT_CODE after ${EXIT_AFTER}s)"
grep "cannot join" "$TMP/join.log" | sed 's/^/# /'

by_hand KILL
by_hand STOP
under_meshrun KILL
under_meshrun STOP
t_done
