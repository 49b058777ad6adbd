#!/bin/sh
# tests/train_elastic_join.sh: --elastic peers join a running job
# (doc/elastic.md, "Joining" and "State transfer"). The hostfile has more
# slots than the peers started: those present form a view of themselves
# after --join-timeout, train, and a peer started later (or two at once)
# is admitted at a step boundary. The members that hold the state send it
# to the joiners, striped, checked by SHA-256. Afterwards every peer exits
# 0: meshtrain compares the weight digests of every peer right after the
# view change and at the end (a mismatch exits 4), so the joiner's weights
# and momentum equal the others' bitwise; rank 0's metrics name every
# step once; every sample of every epoch is used once
# (tests/train_elastic_count.py). A joiner with another secret or job id
# is refused with a clear message (exit 1) and the job goes on undisturbed.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
t_plan 20
N=1200
ITERS=${ELASTIC_ITERS:-250}
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout 10 --iters $ITERS"

# The job is ITERS steps long, and a joiner comes after its start (and
# its catch-up): on a loaded machine the members could finish before it
# asked to join (or was refused), and it would find no job. So the members
# wait at step $LATE for the joiners that have not come by then
# (MESHTRAIN_TEST_JOIN_AT: until MESHTRAIN_TEST_JOINERS of them asked or
# were refused, at most 60 s; none waits once one was admitted). As a rule
# they come long before, and catch up while the members train.
LATE=$((ITERS - 10))

# start NAME SLOTS PRESENT ARGS...: PRESENT peers of a job of SLOTS slots
# (ranks 0 .. PRESENT-1); they form their view after a 3 s join timeout,
# and wait at step $LATE for a joiner (or $MESHTRAIN_TEST_JOIN_AT).
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
        # shellcheck disable=SC2086
        bg env MESHTRAIN_TEST_SAMPLES="$TMP/$_name.samples" \
            MESHTRAIN_TEST_JOIN_AT="${MESHTRAIN_TEST_JOIN_AT:-$LATE}" \
            "$MESHTRAIN" -H "localhost:$_slots" --rank $_r --port "$BASE" \
            --secret-file "$TMP/secret" $TINY --join-timeout 3 \
            --metrics "$TMP/$_name.metrics" "$@" > "$TMP/$_name.p$_r.log" 2>&1
        PEERS="$PEERS $BG_PID"
        _r=$((_r + 1))
    done
}

# check STATUS TEXT NAME: t_ok STATUS TEXT; when STATUS is not 0, show
# the view records of $TMP/NAME.metrics and the last lines but info of
# each $TMP/NAME.p*.log.
check() {
    t_ok "$1" "$2"
    [ "$1" -eq 0 ] && return 0
    t_diag "view records of $3:"
    grep '"event": "\(view\|transfer\)"' "$TMP/$3.metrics" |
        cut -c 1-220 | sed 's/^/#   /'
    for _f in "$TMP/$3".p*.log; do
        t_diag "$_f (but info):"
        grep -v "] info: " "$_f" | tail -n 8 | cut -c 1-300 | sed 's/^/#   /'
    done
    return 0
}

# join NAME SLOTS RANK SECRET ARGS...: start slot RANK later.
join() {
    _name=$1
    _slots=$2
    _r=$3
    _secret=$4
    shift 4
    # shellcheck disable=SC2086
    bg env MESHTRAIN_TEST_SAMPLES="$TMP/$_name.samples" "$MESHTRAIN" \
        -H "localhost:$_slots" --rank "$_r" --port "$BASE" \
        --secret-file "$_secret" $TINY --join-timeout 60 "$@" \
        > "$TMP/$_name.p$_r.log" 2>&1
    PEERS="$PEERS $BG_PID"
}

# 1. 3 of 4 slots train; slot 3 joins at step 25.
start join1 4 3
at_step join1 25
join join1 4 3 "$TMP/secret"
wait_all 120
codes_are "0 0 0 0" join1
t_ok $? "3 of 4 slots train, slot 3 joins: all 4 finish with exit 0"
grep -q "slot(s) 3 joined; 4 peer(s)" "$TMP/join1.p0.log" &&
    grep -q "slot 3 joined view 2: step [0-9]* done" "$TMP/join1.p3.log" &&
    grep -q '"event": "transfer", "view": 2, .*"joiners": \[3\], "senders": \[0,1,2\]' \
        "$TMP/join1.metrics"
t_ok $? "the view change admits slot 3; 3 senders sent it the state"
$COUNT "$TMP/join1.metrics" "$ITERS" $N 16 "$TMP"/join1.samples.*
t_ok $? "joined: every step once, every sample of each epoch once"
# the joiner caught up while the members trained (train/catchup.c): its
# snapshot is of the step the view restarts from or an earlier one, and
# the view change sent it only what it could not rebuild (the digests of
# the state and of the weights after the change proved the rest)
_cu=$(sed -n 's/.*a snapshot of step \([0-9]*\) .* state of step \([0-9]*\) .*/\1 \2/p' \
    "$TMP/join1.p3.log")
_state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/join1.metrics")
_got=$(sed -n 's/.*slot 3 joined view 2: .* state \([0-9]*\) bytes.*/\1/p' \
    "$TMP/join1.p3.log")
# shellcheck disable=SC2086
set -- $_cu
[ $# -eq 2 ] && [ "$1" -le "$2" ] && [ -n "$_got" ] && [ -n "$_state" ] &&
    [ $((_got * 10)) -lt "$_state" ]
t_ok $? "slot 3 caught up in the background: snapshot of step ${1:-?}, \
admitted at step ${2:-?}; the view change sent $_got of $_state bytes"
# the view change hashed the state once on each peer (train/xfer.c): the
# SHA-256 of the weights, taken once, serves the state's digest (the
# members' offer, the joiner's check of what it rebuilt) and the weight
# check after the change
_h=$(sed -n 's/.*the change to view 2, .* SHA-256 over \([0-9]*\) bytes of a \([0-9]*\)-byte state$/\1 \2/p' \
    "$TMP/join1.p0.log" "$TMP/join1.p3.log")
# shellcheck disable=SC2086
set -- $_h
[ $# -eq 4 ] && [ "$1" -eq "$2" ] && [ "$3" -eq "$4" ]
t_ok $? "the change to view 2 hashed the state once: rank 0 ${1:-?} and \
slot 3 ${3:-?} bytes of ${2:-?}"

# 2. 3 of 5 slots train; slots 3 and 4 join at once, in one view change
# (MESHTRAIN_TEST_JOINERS=2: the members wait until both ask, as they would
# when two requests come within one step).
MESHTRAIN_TEST_JOINERS=2
export MESHTRAIN_TEST_JOINERS
start join2 5 3
unset MESHTRAIN_TEST_JOINERS
at_step join2 40
join join2 5 3 "$TMP/secret"
join join2 5 4 "$TMP/secret"
wait_all 120
codes_are "0 0 0 0 0" join2
t_ok $? "3 of 5 slots train, 2 join at once: all 5 finish with exit 0"
[ "$(grep -c '"event": "view"' "$TMP/join2.metrics")" -eq 2 ] &&
    grep -q '"joined": \[3,4\]' "$TMP/join2.metrics"
check $? "both joiners are admitted by one view change" join2
$COUNT "$TMP/join2.metrics" "$ITERS" $N 20 "$TMP"/join2.samples.*
t_ok $? "2 joined: every step once, every sample of each epoch once"

# 3. a sender (slot 1) killed halfway through the transfer: the next view
# leaves it out, and the joiner gets the chunks it lacks from the others.
MESHTRAIN_TEST_FAULT=1:xfer
export MESHTRAIN_TEST_FAULT
start xsend 4 3
unset MESHTRAIN_TEST_FAULT
at_step xsend 20
join xsend 4 3 "$TMP/secret"
wait_all 120
codes_are "0 137 0 0" xsend
t_ok $? "a sender killed during the transfer: the 3 others finish with exit 0"
_state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/xsend.metrics" |
    tail -n 1)
_got=$(sed -n 's/.*slot 3 joined view 3: .* state \([0-9]*\) bytes.*/\1/p' \
    "$TMP/xsend.p3.log")
# (what it kept from the first try depends on what had arrived when the
# mesh failed: usually most of it, possibly nothing)
[ -n "$_got" ] && [ -n "$_state" ] && [ "$_got" -le "$_state" ] &&
    grep -q '"joiners": \[3\], "senders": \[0,2\]' "$TMP/xsend.metrics" &&
    grep -q "slot 3 joined view 3: .*(slot 0: [0-9]*, slot 2: [0-9]*)" \
        "$TMP/xsend.p3.log"
t_ok $? "the joiner got the rest ($_got of $_state bytes) from slots 0 and 2"
$COUNT "$TMP/xsend.metrics" "$ITERS" $N 16 "$TMP"/xsend.samples.*
t_ok $? "sender killed: every step once, every sample of each epoch once"

# 4. the joiner killed halfway through the transfer: the job goes on.
start xjoin 4 3
at_step xjoin 20
MESHTRAIN_TEST_FAULT=3:xfer
export MESHTRAIN_TEST_FAULT
join xjoin 4 3 "$TMP/secret"
unset MESHTRAIN_TEST_FAULT
wait_all 120
codes_are "0 0 0 137" xjoin
t_ok $? "the joiner killed during the transfer: the job finishes with exit 0"
$COUNT "$TMP/xjoin.metrics" "$ITERS" $N 16 "$TMP"/xjoin.samples.*
t_ok $? "joiner killed: every step once, every sample of each epoch once"

# 5. equivalence: with --keep-global-batch a run of 4 that loses slot 3 at
# step 6 and gets it back at step 11 (a new process joins; the others wait
# for it there, MESHTRAIN_TEST_JOIN_AT) has the loss curve of the
# undisturbed run: bitwise before the failure, within
# tests/train_elastic_equiv.sh's tolerance after it (1e-5 relative: float32
# summation order while 3 peers share the step's 4 micro-batches; measured
# here below 4e-7 for 25 such steps), for two seeds.
EQ="--keep-global-batch --algo ring --lr 0.01 --iters 20"
for seed in 1 2; do
    # shellcheck disable=SC2086
    start "base$seed" 4 4 $EQ --seed $seed
    wait_all 120
    codes_are "0 0 0 0" "base$seed" || t_diag "base run $seed failed"
    MESHTRAIN_TEST_FAULT=3:between:5
    MESHTRAIN_TEST_JOIN_AT=10
    export MESHTRAIN_TEST_FAULT MESHTRAIN_TEST_JOIN_AT
    # shellcheck disable=SC2086
    start "regain$seed" 4 4 $EQ --seed $seed
    unset MESHTRAIN_TEST_FAULT MESHTRAIN_TEST_JOIN_AT
    set -- $PEERS
    wait_exit "$4" 60
    # shellcheck disable=SC2086
    join "regain$seed" 4 3 "$TMP/secret" $EQ --seed $seed --join-timeout 30
    set -- $PEERS
    PEERS="$1 $2 $3 $5"
    wait_all 120
    codes_are "0 0 0 0" "regain$seed" &&
        grep -q '"peers": 4, .*"joined": \[3\]' "$TMP/regain$seed.metrics" &&
        python3 - "$TMP/base$seed.metrics" "$TMP/regain$seed.metrics" <<'EOF2'
import json
import sys


def losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)
                if "loss" in r}


base, run = losses(sys.argv[1]), losses(sys.argv[2])
if sorted(base) != list(range(1, 21)) or sorted(run) != sorted(base):
    print("# steps: %s vs %s" % (sorted(base), sorted(run)))
    sys.exit(1)
worst = max(abs(run[s] - base[s]) / abs(base[s]) for s in base)
print("# largest relative loss difference: %.3g" % worst)
sys.exit(0 if worst <= 1e-5 and all(run[s] == base[s] for s in range(1, 6))
         else 1)
EOF2
    t_ok $? "seed $seed: losing slot 3 and regaining it keeps the loss curve \
(bitwise before, within 1e-5 after)"
done

# 6. --rank auto: two joiners started at once on this host take the two
# free slots (3 and 4), one each, and both are admitted.
MESHTRAIN_TEST_JOINERS=2
export MESHTRAIN_TEST_JOINERS
start auto 5 3
unset MESHTRAIN_TEST_JOINERS
at_step auto 20
for _i in a b; do
    bg env MESHTRAIN_TEST_SAMPLES="$TMP/auto.samples" "$MESHTRAIN" \
        -H "localhost:5" --rank auto --port "$BASE" \
        --secret-file "$TMP/secret" $TINY --join-timeout 60 \
        > "$TMP/auto.p$_i.log" 2>&1
    PEERS="$PEERS $BG_PID"
done
wait_all 120
codes_are "0 0 0 0 0" auto &&
    cat "$TMP"/auto.pa.log "$TMP"/auto.pb.log |
    sed -n 's/.*--rank auto: slot \([0-9]*\) .*/\1/p' | sort |
        tr '\n' ' ' | grep -qx "3 4 " &&
    grep -q '"joined": \[3,4\]' "$TMP/auto.metrics"
check $? "--rank auto: two joiners at once take slots 3 and 4, both admitted" \
    auto
$COUNT "$TMP/auto.metrics" "$ITERS" $N 20 "$TMP"/auto.samples.*
t_ok $? "--rank auto: every step once, every sample of each epoch once"

# 7. joiners with another secret (slot 3) and another job id (slot 4), at
# once: refused (exit 1), the job goes on with its 3 peers (which wait at
# step $LATE until both were refused).
MESHTRAIN_TEST_JOINERS=2
export MESHTRAIN_TEST_JOINERS
start refuse 5 3
unset MESHTRAIN_TEST_JOINERS
at_step refuse 20
make_secret "$TMP/secret2"
join refuse 5 3 "$TMP/secret2"
P3=$BG_PID
join refuse 5 4 "$TMP/secret" --job-id another
P4=$BG_PID
wait_exit "$P3" 30
grep -q "refused this peer: the join request's signature is wrong" \
    "$TMP/refuse.p3.log" && [ "$EXIT_CODE" -eq 1 ]
check $? "a joiner with another secret exits 1 ($EXIT_CODE), saying its \
signature is wrong" refuse
wait_exit "$P4" 30
grep -q "refused this peer: it runs another job" "$TMP/refuse.p4.log" &&
    [ "$EXIT_CODE" -eq 1 ]
check $? "a joiner of another job id exits 1 ($EXIT_CODE), saying so" refuse
set -- $PEERS
PEERS="$1 $2 $3"
wait_all 120
codes_are "0 0 0" refuse &&
    [ "$(grep -c '"event"' "$TMP/refuse.metrics")" -eq 1 ]
check $? "the job is undisturbed: its 3 peers finish, no view change" refuse
t_done
