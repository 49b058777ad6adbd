#!/bin/sh
# tests/train_kill.sh: one of 3 training peers dies (SIGKILL) mid-run,
# after checkpoints exist. The survivors must stop within the peer timeout
# (plus slack for a loaded machine) with exit code 3, naming the dead rank;
# under meshrun the job exits non-zero; and the newest checkpoint that
# every peer holds still loads (--resume runs one more step from it).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 5
PEER_TIMEOUT=2
SLACK=15
VICTIM=2
COMMON="$SMALL --data synthetic:4096 --num-classes 10 --in-channels 1 \
--batch 8 --no-eval --algo ring --checkpoint-every 2 --keep 2 \
--checkpoint-dir $TMP/ck --peer-timeout $PEER_TIMEOUT --join-timeout 60"

# wait_ckpt STEP: until every rank's directory has checkpoint STEP.
wait_ckpt() {
    _i=0
    while [ $_i -lt 1200 ]; do
        [ -d "$TMP/ck/rank-0/ckpt-00000000$1" ] &&
        [ -d "$TMP/ck/rank-1/ckpt-00000000$1" ] &&
        [ -d "$TMP/ck/rank-2/ckpt-00000000$1" ] && return 0
        sleep 0.1
        _i=$((_i + 1))
    done
    return 1
}

# shellcheck disable=SC2086
by_hand 3 "$TMP/p" $COMMON --iters 100000
wait_ckpt 4
t_ok $? "3 peers by hand wrote checkpoints 2 and 4"
set -- $PEERS
kill -KILL "$3"
all=0
for r in 0 1; do
    eval pid=\${$((r + 1))}
    wait_exit "$pid" $((PEER_TIMEOUT + SLACK))
    if [ "$EXIT_CODE" -ne 3 ] || ! grep -q "rank $VICTIM" "$TMP/p$r.log"; then
        all=1
        t_diag "rank $r: exit $EXIT_CODE after ${EXIT_AFTER}s"
        t_show "$TMP/p$r.log" 5
    fi
done
t_ok $all "SIGKILL of rank $VICTIM: ranks 0 and 1 exit 3 within \
${PEER_TIMEOUT}+${SLACK}s naming rank $VICTIM"
grep -h "rank $VICTIM" "$TMP/p0.log" | grep -v "info:" | head -n 2 |
    sed 's/^/# /'
wait "$3" 2>/dev/null

# The newest checkpoint all three hold loads: one more step from it.
newest=$(for r in 0 1 2; do ls "$TMP/ck/rank-$r" | grep '^ckpt-' |
         sort | tail -n 1; done | sort | head -n 1 | sed 's/ckpt-0*//')
# shellcheck disable=SC2086
by_hand 3 "$TMP/r" $COMMON --resume --iters $((newest + 1))
wait_all 300
ok=0
[ "$CODES" = "0 0 0" ] || ok=1
grep -q "resumed from step $newest" "$TMP/r0.log" || ok=1
t_ok $ok "--resume loads the newest common checkpoint (step $newest) and \
runs a step (exit codes $CODES)"
[ $ok -eq 0 ] || t_show "$TMP/r0.log"

# Under meshrun: kill one meshtrain; meshrun stops the rest, exits non-zero.
rm -rf "$TMP/ck"
take_ports 3
port=$PORT
# shellcheck disable=SC2086
bg "$MESHRUN" -np 3 -H localhost:3 -- "$MESHTRAIN" --port "$port" $COMMON \
    --iters 100000 > "$TMP/run.log" 2>&1
run=$BG_PID
wait_ckpt 2
ok=$?
child=$(pgrep -P "$run" | tail -n 1)
[ -n "$child" ] && kill -KILL "$child"
wait_exit "$run" $((PEER_TIMEOUT + SLACK + 10))
t_ok $ok "meshrun: peers wrote a checkpoint before the kill"
[ $ok -eq 0 ] && [ "$EXIT_CODE" -ne 0 ] && [ "$EXIT_CODE" -ne 255 ]
t_ok $? "meshrun exits non-zero after a rank was killed (exit $EXIT_CODE \
after ${EXIT_AFTER}s)"
t_done
