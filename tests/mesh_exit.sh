#!/bin/sh
# tests/mesh_exit.sh: meshrun's exit status and the culprit it names, one
# job per row of the table in meshrun(1) and the README:
#   every rank exits 0                  0
#   one rank exits 1 (its own failure)  1, naming it
#   one rank exits 3                    3, naming it
#   every rank exits 3 at once          3 (never 0), naming one of them
#   one rank killed by a signal         128 + S, naming it
#   one rank stopped (SIGSTOP)          3, naming the stopped rank
# A rank's "own failure" stands for a real one: a file where its checkpoint
# directory should be (meshtrain exits 1).
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 8
PT=2
# Runs for minutes unless something fails.
LONG="--op pingpong -b 64 -e 64 -n 1000000000 -w 0 --peer-timeout $PT \
--join-timeout 30"
# sh -c "$ONE" RANK CODE PROGRAM ARGS...: rank RANK exits CODE at once,
# the others run PROGRAM.
ONE='r=$1 c=$2; shift 2; [ "$MESHTRAIN_RANK" = "$r" ] && exit "$c"; exec "$@"'

# job_start NAME MESHRUN-ARGS...: run meshrun in the background into
# $TMP/NAME.log; sets $MR (its pid) and $LOG.
job_start() {
    LOG=$TMP/$1.log
    shift
    bg "$MESHRUN" "$@" > "$LOG" 2>&1
    MR=$BG_PID
}

# check NAME WANT-CODE PATTERN: meshrun exited WANT-CODE and its own
# summary line matches PATTERN.
check() {
    ok=1
    [ "$EXIT_CODE" -eq "$2" ] && grep -Eq "^meshrun: $3" "$LOG" && ok=0
    t_ok $ok "$1: meshrun exits $2 naming the culprit \
(exit $EXIT_CODE after ${EXIT_AFTER}s)"
    [ $ok -eq 0 ] || { t_show "$LOG" 8; }
}

# every rank exits 0
take_ports 3
job_start ok -np 3 -- "$MESHBENCH" --port "$PORT" --op pingpong -b 8 -e 8 \
    -n 2 -w 0 --join-timeout 30
wait_exit "$MR" 60
ok=1
[ "$EXIT_CODE" -eq 0 ] && ! grep -q "^meshrun:" "$LOG" && ok=0
t_ok $ok "every rank exits 0: meshrun exits 0, names no one \
(exit $EXIT_CODE)"
[ $ok -eq 0 ] || t_show "$LOG" 8
ok=1
grep -q '^\[0\] \[meshbench rank 0\] info: joined the mesh' "$LOG" &&
    ! grep -q '\[meshtrain' "$LOG" && ok=0
t_ok $ok "meshbench's log lines say meshbench, not meshtrain"
[ $ok -eq 0 ] || grep 'joined the mesh' "$LOG" | head -n 2 | sed 's/^/# /'

# one rank exits 1, the others run
take_ports 3
job_start one1 -np 3 --grace 2 -- sh -c "$ONE" sh 1 1 "$MESHBENCH" \
    --port "$PORT" $LONG
wait_exit "$MR" 30
check "rank 1 exits 1" 1 "rank 1 \(localhost\) exited with code 1"

# one rank exits 3, the others run: named after the settling time
take_ports 3
job_start one3 -np 3 --grace 2 -- sh -c "$ONE" sh 1 3 "$MESHBENCH" \
    --port "$PORT" $LONG
wait_exit "$MR" 30
check "rank 1 exits 3" 3 "rank 1 \(localhost\) exited with code 3"

# every rank exits 3 within the settling time: never 0
job_start all3 -np 3 -- sh -c 'exit 3'
wait_exit "$MR" 30
check "every rank exits 3 at once" 3 "rank [012] \(localhost\) exited with \
code 3"

# a rank's own failure (meshtrain: its checkpoint directory is a file)
MESHTRAIN=$top_builddir/meshtrain
if [ -x "$MESHTRAIN" ]; then
    take_ports 2
    mkdir "$TMP/ck" && touch "$TMP/ck/rank-1"
    job_start ckpt -np 2 -- "$MESHTRAIN" --port "$PORT" --model resnet18 \
        --width 16 --cifar-stem --image-size 14 --threads 1 \
        --data-threads 1 --quiet --data synthetic --batch 4 --iters 4 \
        --checkpoint-every 2 --checkpoint-dir "$TMP/ck" --join-timeout 30
    wait_exit "$MR" 60
    check "rank 1's checkpoint directory is a file" 1 \
        "rank 1 \(localhost\) exited with code 1"
else
    t_skip "meshtrain not built in $top_builddir"
fi

# signal_rank NAME SIG: a 3-rank job that, once every rank has joined,
# gets SIG on rank 1 ($victim); waits for meshrun.
signal_rank() {
    take_ports 3
    job_start "$1" -np 3 --grace 2 -- "$MESHBENCH" --port "$PORT" $LONG
    i=0
    while [ "$(grep -c 'joined the mesh' "$LOG")" -lt 3 ] && [ $i -lt 300 ]
    do
        sleep 0.1
        i=$((i + 1))
    done
    victim=$(rank_pid "$MR" 1)
    [ -n "$victim" ] && kill -"$2" "$victim"
    wait_exit "$MR" $((PT + 20))
}

# one rank killed by a signal
signal_rank kill KILL
check "rank 1 killed by SIGKILL" 137 "rank 1 \(localhost\) was killed by \
signal 9"

# one rank stopped: the others exit 3 blaming it; meshrun names it, not
# one of them, and stops it too
signal_rank stop STOP
check "rank 1 stopped (SIGSTOP)" 3 "rank 1 \(localhost\) failed the job: \
[12] rank\(s\) name it the culprit"
[ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null

t_done
