#!/bin/sh
# tests/train_hostfile_differs.sh: a peer started with another hostfile than
# the running job's (another slot count, or the same count with another
# host or port for a slot) is refused at once, with the mismatch named on
# both sides, and the job goes on undisturbed.
#  - Without --elastic (meshbench, TCP): the job's acceptor answers a HELLO
#    of another world size with its own, and the newcomer's join fails at
#    once (exit 2, "is in a world of 2 slots, this peer's has 3"); another
#    layout of the same size fails after the authenticated CONFIG exchange
#    (exit 2, "layout=... (the hostfiles list other hosts or ports ...)").
#  - With --elastic (meshtrain): the JOIN carries the slot count and the
#    layout's digest; the members refuse it (exit 1 there, "the job has 5
#    slot(s), this peer's hostfile 6"), log why, and finish without a view
#    change.
# "At once" is checked without a clock: the newcomers' --join-timeout is
# 600 s, and each must exit within the wait's bound of 120 s.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 9

# 1. Without --elastic: 2 ranks ping-pong until stopped.
take_ports 3 || t_skip_all "no free ports"
P=$PORT
make_secret "$TMP/secret"
BENCH="--transport tcp --op pingpong -b 8 -e 8 -w 0 --secret-file $TMP/secret"
# shellcheck disable=SC2086
bg "$MESHBENCH" -H localhost:2 --rank 0 --port "$P" $BENCH -n 1000000000 \
    > "$TMP/job.0.log" 2>&1
J0=$BG_PID
# shellcheck disable=SC2086
bg "$MESHBENCH" -H localhost:2 --rank 1 --port "$P" $BENCH -n 1000000000 \
    > "$TMP/job.1.log" 2>&1
J1=$BG_PID
wait_for "$TMP/job.0.log" '^\[0\] +pingpong|^\[0\] # meshbench|^# op' 60
# a third slot: it dials ranks 0 and 1 of its own hostfile, the job's
# shellcheck disable=SC2086
bg "$MESHBENCH" -H localhost:3 --rank 2 --port "$P" $BENCH -n 10 \
    --join-timeout 600 > "$TMP/big.log" 2>&1
wait_exit "$BG_PID" 120
t_ok $([ "$EXIT_CODE" -eq 2 ] &&
    grep -q "cannot join the mesh: rank [01] (localhost:[0-9]*) is in a world of 2 slots, this peer's has 3: its hostfile" \
        "$TMP/big.log"
    echo $?) "a peer of a 3-slot hostfile fails its join at once, naming \
both sizes (exit $EXIT_CODE)"
t_show "$TMP/big.log" 2
# (the rank that answered logs it right after its answer: wait for it)
_i=0
until grep -q "world size 3, expected 2 (the hostfiles differ: 3 slots there, 2 here)" \
    "$TMP/job.0.log" "$TMP/job.1.log" || [ $_i -ge 600 ]; do
    sleep 0.1
    _i=$((_i + 1))
done
[ $_i -lt 600 ]
t_ok $? "the job's rank that answered logs the refusal with both sizes"
# the same 2 slots, rank 1 on another port
printf 'localhost port=%s slots=1\nlocalhost port=%s slots=1\n' "$P" \
    "$((P + 2))" > "$TMP/hostfile"
# shellcheck disable=SC2086
bg "$MESHBENCH" --hostfile "$TMP/hostfile" --rank 1 $BENCH -n 1000000000 \
    --join-timeout 600 > "$TMP/layout.log" 2>&1
wait_exit "$BG_PID" 120
t_ok $([ "$EXIT_CODE" -eq 2 ] &&
    grep -q "refused by rank 0 .*configuration differs: layout=.* (the hostfiles list other hosts or ports for the slots)" \
        "$TMP/layout.log"
    echo $?) "a peer of another layout of 2 slots fails at once, naming \
the layout (exit $EXIT_CODE)"
t_show "$TMP/layout.log" 2
alive=0
kill -0 "$J0" 2> /dev/null && kill -0 "$J1" 2> /dev/null && alive=1
kill "$J0" "$J1" 2> /dev/null
t_ok $([ $alive -eq 1 ]; echo $?) "the job ran on undisturbed"

# 2. --elastic: 3 of 5 slots train; joiners for slots 3 and 4 with
# another slot count and another layout are refused. The members wait at
# step LATE until both were (MESHTRAIN_TEST_JOIN_AT, _JOINERS).
N=600
ITERS=40
LATE=$((ITERS - 5))
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --elastic --peer-timeout 10 \
--iters $ITERS"
take_ports 8 || t_skip_all "no free ports"
B=$PORT
PEERS=""
for r in 0 1 2; do
    # shellcheck disable=SC2086
    bg env MESHTRAIN_TEST_JOIN_AT=$LATE MESHTRAIN_TEST_JOINERS=2 \
        "$MESHTRAIN" -H localhost:5 --rank $r --port "$B" \
        --secret-file "$TMP/secret" $TINY --join-timeout 3 \
        --metrics "$TMP/el.metrics" > "$TMP/el.p$r.log" 2>&1
    PEERS="$PEERS $BG_PID"
done
wait_for "$TMP/el.metrics" '"step": 3,' 120
# shellcheck disable=SC2086
bg "$MESHTRAIN" -H localhost:6 --rank 3 --port "$B" \
    --secret-file "$TMP/secret" $TINY --join-timeout 600 > "$TMP/el.big.log" 2>&1
BIG=$BG_PID
printf 'localhost port=%s slots=4\nlocalhost port=%s slots=1\n' "$B" \
    "$((B + 7))" > "$TMP/hostfile5"
# shellcheck disable=SC2086
bg "$MESHTRAIN" --hostfile "$TMP/hostfile5" --rank 4 \
    --secret-file "$TMP/secret" $TINY --join-timeout 600 > "$TMP/el.layout.log" 2>&1
LAY=$BG_PID
wait_exit "$BIG" 120
t_ok $([ "$EXIT_CODE" -eq 1 ] &&
    grep -q "refused this peer: the job has 5 slot(s), this peer's hostfile 6 (-H or --hostfile differ" \
        "$TMP/el.big.log"
    echo $?) "--elastic: a joiner of a 6-slot hostfile is refused at once, \
naming both counts (exit $EXIT_CODE)"
t_show "$TMP/el.big.log" 2
wait_exit "$LAY" 120
t_ok $([ "$EXIT_CODE" -eq 1 ] &&
    grep -q "refused this peer: the job's hostfile lists other hosts or ports for its 5 slots" \
        "$TMP/el.layout.log"
    echo $?) "--elastic: a joiner of another layout of 5 slots is refused \
at once (exit $EXIT_CODE)"
t_show "$TMP/el.layout.log" 2
wait_all 120
codes_are "0 0 0" el
t_ok $? "--elastic: the 3 members finish, exit 0"
[ "$(grep -c '"event"' "$TMP/el.metrics")" -eq 1 ]
t_ok $? "--elastic: no view change but the first (the job undisturbed)"
grep -q "refused a join request from slot 3: its hostfile has 6 slot(s), this job's 5" \
    "$TMP/el.p0.log" &&
    grep -q "refused a join request from slot 4: its hostfile lists other hosts or ports" \
        "$TMP/el.p0.log"
t_ok $? "--elastic: the members log both refusals, with the counts"
t_done
