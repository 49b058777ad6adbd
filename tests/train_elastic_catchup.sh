#!/bin/sh
# tests/train_elastic_catchup.sh: a joiner catches up while the members
# train (doc/elastic.md, "Catching up"; train/catchup.c). It fetches a
# snapshot of step X on side connections and replays the reduced
# gradients of the steps that pass; the view change that admits it at
# step R >= X sends it only what it could not rebuild. Afterwards every
# peer exits 0: the state's SHA-256 in the view change and the weight
# digests right after it and at the end prove the joiner's weights and
# momentum equal the others' bitwise; rank 0's metrics name every step
# once; every sample of every epoch is used once
# (tests/train_elastic_count.py). The snapshot is of the state the
# members held when the joiner asked (not of their next step boundary),
# fetched while the joiner builds its model. Faults during the catch-up:
# a member killed (the joiner starts again in the members' next view), the joiner
# killed (the job goes on, never having waited for it), a second
# joiner arriving while the first catches up, and a member whose records'
# headers are forged (their signatures fail: the joiner refuses them and
# fetches from the others). On --device devsim (the GPU
# test double: device memory, copies that land late and out of order),
# the members serve the host copy of their boundary's snapshot and
# download the reduced gradients; the joiner loads the snapshot into the
# device and replays with the device's optimizer. The members pause 30 ms at
# each step (MESHTRAIN_TEST_STEP_MS) so that a joiner's start and its
# catch-up fall inside the run on a loaded machine.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
t_plan 26
N=800
ITERS=${CATCHUP_ITERS:-160}
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout 10 --iters $ITERS"

# start NAME SLOTS PRESENT ARGS...: PRESENT peers of a job of SLOTS slots
# (ranks 0 .. PRESENT-1); they form their view after a 3 s join timeout.
start() {
    _name=$1
    _slots=$2
    _n=$3
    shift 3
    rm -f "$TMP/$_name".*
    take_ports "$_slots" || return 1
    BASE=$PORT
    make_secret "$TMP/secret"
    PEERS=""
    _r=0
    while [ $_r -lt "$_n" ]; do
        # (the test aid MESHTRAIN_TEST_SIDE on slot FORGE_SLOT only)
        _side=
        [ "$_r" = "${FORGE_SLOT:-}" ] && _side=forge
        # shellcheck disable=SC2086
        bg env MESHTRAIN_TEST_SAMPLES="$TMP/$_name.samples" \
            MESHTRAIN_TEST_SIDE="$_side" MESHTRAIN_TEST_STEP_MS=30 "$MESHTRAIN" \
            -H "localhost:$_slots" --rank $_r --port "$BASE" \
            --secret-file "$TMP/secret" $TINY --join-timeout 3 \
            --metrics "$TMP/$_name.metrics" "$@" > "$TMP/$_name.p$_r.log" 2>&1
        PEERS="$PEERS $BG_PID"
        _r=$((_r + 1))
    done
}

# join NAME SLOTS RANK ARGS...: start slot RANK later.
join() {
    _name=$1
    _slots=$2
    _r=$3
    shift 3
    # shellcheck disable=SC2086
    bg env MESHTRAIN_TEST_SAMPLES="$TMP/$_name.samples" "$MESHTRAIN" \
        -H "localhost:$_slots" --rank "$_r" --port "$BASE" \
        --secret-file "$TMP/secret" $TINY --join-timeout 60 "$@" \
        > "$TMP/$_name.p$_r.log" 2>&1
    PEERS="$PEERS $BG_PID"
}

# caught_up NAME SLOT: the joiner's snapshot is of the step it was
# admitted at or an earlier one (it asks to be admitted once it holds the
# snapshot: R = X when a view change restarts from X, as after a failure
# at that step), and the view change sent it under a tenth of the state;
# CU_MSG says what it saw.
caught_up() {
    _cu=$(sed -n 's/.*a snapshot of step \([0-9]*\) .* state of step \([0-9]*\) .*/\1 \2/p' \
        "$TMP/$1.p$2.log" | tail -n 1)
    _state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/$1.metrics" |
        tail -n 1)
    _got=$(sed -n "s/.*slot $2 joined view [0-9]*: .* state \([0-9]*\) bytes.*/\1/p" \
        "$TMP/$1.p$2.log")
    # shellcheck disable=SC2086
    set -- $_cu
    CU_MSG="snapshot of step ${1:-?}, admitted at step ${2:-?}; the view \
change sent ${_got:-?} of ${_state:-?} bytes"
    [ $# -eq 2 ] && [ "$1" -le "$2" ] && [ -n "$_got" ] &&
        [ -n "$_state" ] && [ $((_got * 10)) -lt "$_state" ]
}

# served_live NAME SLOT: the joiner's snapshot is of the step the members
# were at when it asked, and a member copied it at once ("the live state
# when it asked"), not at a later step boundary; or a member answered
# LATE (it was in that step's update, or past it) and the joiner asked
# again, ahead. LIVE_MSG says which.
served_live() {
    _xl=$(sed -n 's/.*a snapshot of step \([0-9]*\) (.*the members were at step \([0-9]*\) when.*/\1 \2/p' \
        "$TMP/$1.p$2.log" | tail -n 1)
    # shellcheck disable=SC2086
    set -- "$1" "$2" $_xl
    LIVE_MSG="snapshot of step ${3:-?}, the members at step ${4:-?} when it \
asked"
    if grep -q "catch-up: slot [0-9]* is past step" "$TMP/$1.p$2.log"; then
        LIVE_MSG="$LIVE_MSG (after a LATE)"
        [ $# -eq 4 ] && [ "$3" -ge "$4" ]
        return
    fi
    [ $# -eq 4 ] && [ "$3" -eq "$4" ] &&
        cat "$TMP/$1".p*.log | grep -q "catch-up: slot $2 is sent the \
snapshot of step $3, the live state when it asked"
}

# 1-2. 2 of 3 slots train with top-k gradients (error feedback, each
# peer's own), and 4 of 5 with --keep-global-batch and another seed; the
# last slot joins and catches up.
start a 3 2 --compress topk:0.05 --seed 3
at_step a 20
join a 3 2 --compress topk:0.05 --seed 3
wait_all 300
codes_are "0 0 0" a && caught_up a 2
t_ok $? "2 of 3 slots, top-k: slot 2 caught up while they trained ($CU_MSG)"
served_live a 2
t_ok $? "top-k: a snapshot of the members' live state ($LIVE_MSG)"
$COUNT "$TMP/a.metrics" "$ITERS" $N 12 "$TMP"/a.samples.*
t_ok $? "top-k: every step once, every sample of each epoch once"

start b 5 4 --keep-global-batch --seed 7
at_step b 20
join b 5 4 --keep-global-batch --seed 7
wait_all 300
codes_are "0 0 0 0 0" b && caught_up b 4
t_ok $? "4 of 5 slots, --keep-global-batch: slot 4 caught up ($CU_MSG)"
served_live b 4
t_ok $? "keep-global-batch: a snapshot of the members' live state ($LIVE_MSG)"
$COUNT "$TMP/b.metrics" "$ITERS" $N 20 "$TMP"/b.samples.*
t_ok $? "keep-global-batch: every step once, every sample of each epoch once"

# 3. a member (slot 1) is killed once it queued its snapshot stripe for
# the joiner: the others agree on a view without it, and the joiner is
# admitted in that view change (when its snapshot came whole) or starts
# its catch-up again from them and is admitted in the next.
MESHTRAIN_TEST_FAULT=1:catchup
export MESHTRAIN_TEST_FAULT
start msend 4 3
unset MESHTRAIN_TEST_FAULT
at_step msend 20
join msend 4 3
wait_all 300
codes_are "0 137 0 0" msend
t_ok $? "a member killed during the catch-up: the 3 others finish with exit 0"
grep -q '"left": \[1\], "joined": \[' "$TMP/msend.metrics" &&
    grep -q '"joined": \[3\]' "$TMP/msend.metrics" &&
    grep -q "slot 3 joined view [23]: step" "$TMP/msend.p3.log"
t_ok $? "slot 1 is left out, and slot 3 admitted (in that view or the next)"
caught_up msend 3
t_ok $? "the joiner caught up again from slots 0 and 2 ($CU_MSG)"
# (r31's netns sweep: a joiner whose catch-up began before a member died
# waited 1 s after the close before it started again; the job ended
# meanwhile, and it was never admitted)
grep -q "slot 3 joined view 2:" "$TMP/msend.p3.log" ||
    grep -q "catch-up: the members' view 2 (slots 0,2) leaves out this peer" \
        "$TMP/msend.p3.log"
t_ok $? "admitted in view 2, or started again as soon as the members reported view 2"
$COUNT "$TMP/msend.metrics" "$ITERS" $N 16 "$TMP"/msend.samples.*
t_ok $? "member killed: every step once, every sample of each epoch once"

# 4. the joiner is killed once it loaded the snapshot: it was never
# admitted, so the members never waited for it; they finish alone.
start mjoin 4 3
at_step mjoin 20
MESHTRAIN_TEST_FAULT=3:catchup
export MESHTRAIN_TEST_FAULT
join mjoin 4 3
unset MESHTRAIN_TEST_FAULT
wait_all 300
codes_are "0 0 0 137" mjoin &&
    grep -q "test fault: signal 9 at catchup" "$TMP/mjoin.p3.log"
t_ok $? "the joiner killed during its catch-up: the 3 members finish with 0"
[ "$(grep -c '"event": "view"' "$TMP/mjoin.metrics")" -eq 1 ]
t_ok $? "no view change: the joiner was never admitted"
$COUNT "$TMP/mjoin.metrics" "$ITERS" $N 12 "$TMP"/mjoin.samples.*
t_ok $? "joiner killed: every step once, every sample of each epoch once"

# 5. a second joiner (slot 4) starts while the first (slot 3) catches
# up: each catches up on its own connections; both are admitted, and
# end with the others' weights.
start two 5 3
at_step two 20
join two 5 3
sleep 0.1
join two 5 4
wait_all 300
codes_are "0 0 0 0 0" two &&
    grep -q "slot 3 joined view [0-9]*: step" "$TMP/two.p3.log" &&
    grep -q "slot 4 joined view [0-9]*: step" "$TMP/two.p4.log"
t_ok $? "two joiners a moment apart: all 5 finish with exit 0, both admitted"
caught_up two 3 && _m3=$CU_MSG && caught_up two 4
t_ok $? "both caught up (slot 3: $_m3; slot 4: $CU_MSG)"
$COUNT "$TMP/two.metrics" "$ITERS" $N 20 "$TMP"/two.samples.*
t_ok $? "two joiners: every step once, every sample of each epoch once"

# 5b. hostile bytes on a side connection: slot 1 changes a byte of its
# SNAP record's header after signing it (MESHTRAIN_TEST_SIDE=forge; over
# verbs that byte is the rkey the joiner would read at). The joiner
# refuses the record, naming slot 1, and its next try stripes the
# snapshot across slots 0 and 2 only; it catches up and ends with the
# others' weights.
FORGE_SLOT=1
start forge 4 3
FORGE_SLOT=
at_step forge 20
join forge 4 3
wait_all 300
codes_are "0 0 0 0" forge && caught_up forge 3
t_ok $? "a member's forged record: all 4 finish with exit 0, slot 3 caught \
up ($CU_MSG)"
grep -q "catch-up: slot 1 (localhost:[0-9]*) sent a SNAP record whose header is not signed with the job's secret.*refused; its stripe is fetched from the other member" \
    "$TMP/forge.p3.log" &&
    grep -q "MESHTRAIN_TEST_SIDE: forge" "$TMP/forge.p1.log"
t_ok $? "the joiner refused slot 1's forged SNAP header, naming it, and \
fetched its stripe from the others"
$COUNT "$TMP/forge.metrics" "$ITERS" $N 16 "$TMP"/forge.samples.*
t_ok $? "forged record: every step once, every sample of each epoch once"

# 6. on --device devsim, its copies 300 us late and finishing newest
# first, with --compress fp16 (narrowed and widened on the device): the
# joiner catches up in the background, loads the snapshot into the
# device and replays there; the digests (the view change's, every 10
# steps and at the end) prove its weights and momentum the members'.
MESHTRAIN_DEVSIM_COPY_US=300
MESHTRAIN_DEVSIM_COPY_ORDER=lifo
export MESHTRAIN_DEVSIM_COPY_US MESHTRAIN_DEVSIM_COPY_ORDER
start dev 3 2 --device devsim --compress fp16 --seed 5
at_step dev 20
join dev 3 2 --device devsim --compress fp16 --seed 5
unset MESHTRAIN_DEVSIM_COPY_US MESHTRAIN_DEVSIM_COPY_ORDER
wait_all 300
codes_are "0 0 0" dev && caught_up dev 2
t_ok $? "devsim: slot 2 caught up while 2 of 3 slots trained ($CU_MSG)"
grep -q "catch-up: slot 2 is sent the snapshot of step" "$TMP/dev.p0.log" &&
    grep -q "catch-up: slot 2 is sent the snapshot of step" "$TMP/dev.p1.log"
t_ok $? "devsim: both members served a stripe of their host copy"
$COUNT "$TMP/dev.metrics" "$ITERS" $N 12 "$TMP"/dev.samples.*
t_ok $? "devsim: every step once, every sample of each epoch once"

# 7. members without the side port (MESHTRAIN_NO_CATCHUP): the joiner
# waits at most 3 s for the ports, then asks to be admitted and receives
# the whole state in the view change, as before.
MESHTRAIN_NO_CATCHUP=1
export MESHTRAIN_NO_CATCHUP
start old 4 3
unset MESHTRAIN_NO_CATCHUP
at_step old 20
join old 4 3
wait_all 300
_state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/old.metrics")
codes_are "0 0 0 0" old &&
    grep -q "slot 3 joined view 2: .* state $_state bytes received" \
        "$TMP/old.p3.log"
t_ok $? "members that serve no catch-up: the joiner gets all $_state bytes"

# 8. a state of several 4 MiB cells (--width 20: 1.1 M parameters): 3
# members' stripes cut cells, each stripe's digest is over its pieces,
# and the joiner builds the state's hash from the cells; the digests
# (the view change's, every 10 steps and at the end) prove its weights
# and momentum the members'.
start cells 4 3 --width 20 --seed 11
at_step cells 20
join cells 4 3 --width 20 --seed 11
wait_all 300
codes_are "0 0 0 0" cells && caught_up cells 3
t_ok $? "3 senders, a state of several cells: slot 3 caught up ($CU_MSG)"
$COUNT "$TMP/cells.metrics" "$ITERS" $N 16 "$TMP"/cells.samples.*
t_ok $? "several cells: every step once, every sample of each epoch once"
t_done
