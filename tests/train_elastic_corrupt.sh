#!/bin/sh
# tests/train_elastic_corrupt.sh: a joiner refuses a state that fails its
# SHA-256 check (doc/elastic.md, "State transfer"), and the job goes on.
# MESHTRAIN_TEST_XFER_CORRUPT=SLOT makes one sender flip a byte of every
# chunk it sends after hashing the state (a transfer corrupted on the way);
# SLOT:offer makes it offer a wrong digest (a sender whose state is not the
# others'). In each case the joiner exits 4 naming the problem, before it
# reads a field of the state; the members leave it out in the next view,
# train to the end and exit 0 (their weight digests agree after the view
# change and at the end, else they exit 4); rank 0's metrics name every
# step once and every sample of every epoch is used once
# (tests/train_elastic_count.py). Several seeds, view sizes and senders.
# SLOT:catchup corrupts only the snapshot a joiner fetches while the
# members train (train/catchup.c): the joiner must see it, drop the
# catch-up, and join with the whole state from the view change. SLOT:xfer
# corrupts only the view change's chunks, which a joiner that caught up
# checks against the weights it rebuilt.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
t_plan 17
N=600
ITERS=60
JOINAT=10
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout 10"

# run NAME SLOTS PRESENT JOINER SEED: PRESENT peers of a job of SLOTS
# slots train (their view forms after a 3 s join timeout); slot JOINER
# starts at step 5 and asks to join (the members wait for it at step
# $JOINAT: MESHTRAIN_TEST_JOIN_AT; none when empty). $CORRUPT is the
# members' test aid; the run has $ITERS steps.
run() {
    _name=$1
    _slots=$2
    _n=$3
    _j=$4
    _seed=$5
    rm -f "$TMP/$_name".*
    take_ports "$_slots" || return 1
    make_secret "$TMP/secret"
    PEERS=""
    _r=0
    while [ $_r -lt "$_n" ]; do
        # shellcheck disable=SC2086
        bg env MESHTRAIN_TEST_SAMPLES="$TMP/$_name.samples" \
            MESHTRAIN_TEST_XFER_CORRUPT="$CORRUPT" \
            ${JOINAT:+MESHTRAIN_TEST_JOIN_AT=$JOINAT} "$MESHTRAIN" \
            -H "localhost:$_slots" --rank $_r --port "$PORT" \
            --secret-file "$TMP/secret" $TINY --iters "$ITERS" --seed "$_seed" \
            --join-timeout 3 --metrics "$TMP/$_name.metrics" \
            > "$TMP/$_name.p$_r.log" 2>&1
        PEERS="$PEERS $BG_PID"
        _r=$((_r + 1))
    done
    wait_for "$TMP/$_name.metrics" '"step": 5,' 120
    # shellcheck disable=SC2086
    bg env MESHTRAIN_TEST_SAMPLES="$TMP/$_name.samples" "$MESHTRAIN" \
        -H "localhost:$_slots" --rank "$_j" --port "$PORT" \
        --secret-file "$TMP/secret" $TINY --iters "$ITERS" --seed "$_seed" \
        --join-timeout 60 > "$TMP/$_name.p$_j.log" 2>&1
    PEERS="$PEERS $BG_PID"
    wait_all 120
}

# check NAME WANT_CODES JOINER MESSAGE PRESENT SLOTS: the joiner said
# MESSAGE and exited 4, the members exited 0 after a view that left the
# joiner out, and every step and sample was counted once.
check() {
    if [ "$CODES" = "$2" ] &&
        grep -q "state transfer: $4" "$TMP/$1.p$3.log"; then
        t_ok 0 "$1: the joiner (slot $3) is refused with exit 4: $4"
    else
        t_ok 1 "$1: the joiner (slot $3) is refused with exit 4: $4"
        t_diag "exit codes $CODES, want $2"
        for _f in "$TMP/$1".p*.log; do
            t_diag "$_f:"
            t_show "$_f" 8
        done
    fi
    # the view that admitted it failed (no record); the next leaves it out
    # (from the boundary that admitted it: step 10, where the members wait
    # for it, or an earlier one where it asked before they got there: since
    # 9f2c687 a joiner without a catch-up asks once its model is built)
    if grep -q "\"view\": [3-9], \"step\": [0-9]*, .*\"left\": \[$3\]" \
        "$TMP/$1.metrics" && ! grep -q "slot $3 joined view" "$TMP/$1.p$3.log"
    then
        t_ok 0 "$1: the members leave slot $3 out and train on without it"
    else
        t_ok 1 "$1: the members leave slot $3 out and train on without it"
        grep '"event"' "$TMP/$1.metrics" | sed 's/^/#   /'
    fi
    # shellcheck disable=SC2086
    $COUNT "$TMP/$1.metrics" "$ITERS" $N $((4 * ($5 + 1))) "$TMP"/$1.samples.*
    t_ok $? "$1: every step once, every sample of each epoch once"
}

# 1. a sender's chunks are corrupted on the way: 3 of 4 slots, slot 1 of
# the 3 senders corrupts, slot 3 joins; the digest of what arrived differs.
CORRUPT=1 run data3 4 3 3 1
check data3 "0 0 0 4" 3 "the [0-9]* bytes received do not hash" 3 4

# 2. the same with 4 of 6 slots, another seed, the last sender corrupting,
# slot 5 joining (slot 4 stays a spare).
CORRUPT=3 run data4 6 4 5 2
check data4 "0 0 0 0 4" 5 "the [0-9]* bytes received do not hash" 4 6

# 3. a sender offers another digest than the others: 3 of 5 slots, slot 2
# offers a wrong one, slot 3 joins and refuses before it asks for a chunk.
CORRUPT=2:offer run offer3 5 3 3 3
check offer3 "0 0 0 4" 3 "the senders offer different states" 3 5

# 4. a single sender (MESHTRAIN_XFER_SENDERS=1, the bench aid) offers a
# digest that its bytes do not have: nobody to compare the offer with, so
# the hash of what arrived catches it.
MESHTRAIN_XFER_SENDERS=1
export MESHTRAIN_XFER_SENDERS
CORRUPT=0:offer run offer1 4 3 3 4
unset MESHTRAIN_XFER_SENDERS
check offer1 "0 0 0 4" 3 "the [0-9]* bytes received do not hash" 3 4

# 5. the catch-up snapshot corrupted (slot 1 of 3), the view change's
# transfer not: the members train on while slot 3 fetches the snapshot
# (MESHTRAIN_TEST_JOIN_AT only near the end, for a joiner slowed by a
# loaded machine, which would otherwise find the job over), its SHA-256
# check fails, and slot 3 joins with the whole state from the view
# change: every peer exits 0.
ITERS=250
JOINAT=$((ITERS - 10))
CORRUPT=1:catchup run catch3 4 3 3 5
if [ "$CODES" = "0 0 0 0" ] &&
    grep -q "catch-up: the snapshot received does not hash" \
        "$TMP/catch3.p3.log" &&
    grep -q "slot 3 joined view" "$TMP/catch3.p3.log"; then
    t_ok 0 "catch3: the joiner refuses the corrupted catch-up snapshot and \
joins with the whole state; all 4 exit 0"
else
    t_ok 1 "catch3: the joiner refuses the corrupted catch-up snapshot and \
joins with the whole state; all 4 exit 0"
    t_diag "exit codes $CODES, want 0 0 0 0"
    t_show "$TMP/catch3.p3.log" 12
fi
_got=$(sed -n 's/.*slot 3 joined view [0-9]*: .* state \([0-9]*\) bytes.*/\1/p' \
    "$TMP/catch3.p3.log")
_state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/catch3.metrics" |
    tail -n 1)
[ -n "$_got" ] && [ "$_got" = "$_state" ]
t_ok $? "catch3: the view change sent the whole state (${_got:-?} of \
${_state:-?} bytes)"
# shellcheck disable=SC2086
$COUNT "$TMP/catch3.metrics" "$ITERS" $N 16 "$TMP"/catch3.samples.*
t_ok $? "catch3: every step once, every sample of each epoch once"

# 6. the view change's chunks corrupted (slot 1 of 3), the catch-up's not:
# slot 3 catches up, and the view change sends it only the chunks across
# the edges of what it rebuilt; the bytes of the weights' range in them
# are not its own, and the whole state it holds does not hash to the
# offered digest: it exits 4; the members train on without it. Where the
# members reach step $JOINAT before the joiner's catch-up finished (a
# loaded machine), they admit it at once with the whole state, which it
# refuses as in 1-3: a refusal too, but not of a rebuilt state, so the
# run is tried again (up to 3 times) and the check skipped, with the
# reason, if the catch-up never finished in time.
_try=1
while :; do
    CORRUPT=1:xfer run edge3 4 3 3 6
    grep -q "state transfer: the state rebuilt from the catch-up" \
        "$TMP/edge3.p3.log" && break
    [ "$CODES" = "0 0 0 4" ] && [ $_try -lt 3 ] &&
        grep -q "state transfer: the [0-9]* bytes received do not hash" \
            "$TMP/edge3.p3.log" || break
    t_diag "edge3, try $_try: the joiner was admitted before its catch-up \
finished (the whole state refused); again"
    _try=$((_try + 1))
done
if [ "$CODES" = "0 0 0 4" ] &&
    grep -q "state transfer: the [0-9]* bytes received do not hash" \
        "$TMP/edge3.p3.log"; then
    t_skip "edge3: in 3 tries the members reached step $JOINAT before the \
joiner's catch-up finished (a loaded machine); it refused the whole state"
elif [ "$CODES" = "0 0 0 4" ] &&
    grep -q "state transfer: the state rebuilt from the catch-up and the \
[0-9]* bytes received do not hash" "$TMP/edge3.p3.log" &&
    grep -q '"left": \[3\]' "$TMP/edge3.metrics"; then
    t_ok 0 "edge3: the joiner that caught up refuses the corrupted chunks \
(exit 4); the members leave it out"
else
    t_ok 1 "edge3: the joiner that caught up refuses the corrupted chunks \
(exit 4); the members leave it out"
    t_diag "exit codes $CODES, want 0 0 0 4"
    t_show "$TMP/edge3.p3.log" 12
fi
# shellcheck disable=SC2086
$COUNT "$TMP/edge3.metrics" "$ITERS" $N 16 "$TMP"/edge3.samples.*
t_ok $? "edge3: every step once, every sample of each epoch once"
t_done
