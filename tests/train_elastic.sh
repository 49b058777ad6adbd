#!/bin/sh
# tests/train_elastic.sh: --elastic survives dead peers (doc/elastic.md).
# 6 peers train a tiny ResNet-18 on synthetic data by hand or under
# meshrun; one or two are killed (SIGKILL) or stopped (SIGSTOP) while
# they train. The survivors agree on a new view, roll back to the step
# every one of them holds, redo it, and finish with exit 0: the digests
# agree after every view change and at the end (checked by meshtrain, a
# mismatch exits 4); rank 0's metrics name every step once, in order; and
# every sample of every epoch is used once (tests/train_elastic_count.py
# counts the positions each peer trained, MESHTRAIN_TEST_SAMPLES). A
# stopped peer that comes back finds itself left out (exit 5); a view
# below --min-peers stops with exit 6. Under meshrun, a killed rank stops
# nobody, and a stopped one left out of the view is stopped once the job
# finished, so that meshrun exits.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
t_plan 19
# A SIGKILL is seen at once (EOF): a long peer timeout there keeps a
# loaded machine's scheduling stalls from looking like deaths; the SIGSTOP
# case, which waits for it, has a short one.
PEER_TIMEOUT=10
N=1200
BATCH=4
ITERS=${ELASTIC_ITERS:-120}
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch $BATCH --no-eval --verify-every 10 --elastic \
--peer-timeout $PEER_TIMEOUT --join-timeout 60"
# The faults come from this script once rank 0's metrics reach a step, so
# the job must still run then, however fast the machine: its steps last
# 20 ms at least (MESHTRAIN_TEST_STEP_MS, a pause at each step's start),
# which leaves 2 s or more after the fault's step. Without it 120 steps
# took 0.5 to 3 s here, and the job could end before the kill came (with
# ELASTIC_ITERS=40, a job 3 times shorter, meshrun's job always did).
MESHTRAIN_TEST_STEP_MS=20
export MESHTRAIN_TEST_STEP_MS

# start NAME PEERS ARGS...: PEERS peers by hand, samples and metrics under
# $TMP/NAME.
start() {
    _name=$1
    _n=$2
    shift 2
    rm -f "$TMP/$_name".*
    MESHTRAIN_TEST_SAMPLES=$TMP/$_name.samples
    export MESHTRAIN_TEST_SAMPLES
    # shellcheck disable=SC2086
    by_hand "$_n" "$TMP/$_name.p" $TINY --metrics "$TMP/$_name.metrics" "$@"
    unset MESHTRAIN_TEST_SAMPLES
}

# at_step NAME STEP: wait until rank 0's metrics reach STEP.
# pid_of R: the pid of peer R of the last start.
pid_of() {
    _r=$1
    set -- $PEERS
    shift "$_r"
    echo "$1"
}

# counted NAME STEPS GMAX: the counting checks.
counted() {
    $COUNT "$TMP/$1.metrics" "$2" $N "$3" "$TMP/$1".samples.*
}

# codes_are WANT NAME: $CODES is WANT, else show the logs.
# 1. SIGKILL of one peer of 6 while they train.
start kill1 6 --iters "$ITERS"
at_step kill1 15
kill -KILL "$(pid_of 3)"
wait_all 120
codes_are "0 0 0 137 0 0" kill1
t_ok $? "SIGKILL of peer 3 of 6: the 5 others finish with exit 0"
grep -q "view 1: slot 3 (localhost:[0-9]*) left" "$TMP/kill1.p0.log"
t_ok $? "rank 0 logs the view change naming slot 3"
grep -h "view 1:" "$TMP/kill1.p0.log" | head -n 1 | cut -c 1-300 |
    sed 's/^/# /'
counted kill1 "$ITERS" $((6 * BATCH))
t_ok $? "SIGKILL: every step once in the metrics, every sample once per epoch"
# auto chose from the built-in numbers in the new view too (measuring
# it would lengthen every view change), so every survivor chose the same
# algorithms: the last choice each logged.
same=0
choice=""
for r in 0 1 2 4 5; do
    f=$TMP/kill1.p$r.log
    grep -q "collectives: 5 ranks.*not measured: defaults" "$f" || same=1
    c=$(grep "collectives: auto all-reduce:" "$f" | tail -n 1 |
        sed 's/.*collectives: //')
    [ -n "$c" ] || same=1
    [ -z "$choice" ] && choice=$c
    [ "$c" = "$choice" ] || same=1
done
t_ok $same "auto not re-measured in view 1; every survivor took the same \
choice"
t_diag "$choice"
# every survivor heard the others or had its mesh blame slot 3: a
# survivor decided view 1 without waiting the settle time
grep -l "view 1 decided without the settle time: every member of view 0 \
heard (slots 0,1,2,4,5) or blamed by this peer's mesh (slots 3)" \
    "$TMP"/kill1.p[01245].log > /dev/null
t_ok $? "a survivor decided view 1 at once: slot 3 blamed, the rest heard"
# the view change's record says where its time went
num='[0-9.e-]*'
grep '"event": "view"' "$TMP/kill1.metrics" | head -n 1 |
    grep -q "\"parts\": {\"agree\": $num, \"restore\": $num, \"mesh\": $num, \
\"xfer\": $num, \"ready\": $num}"
t_ok $? "the view record holds its parts (agree, restore, mesh, xfer, ready)"

# 2. SIGKILL of two peers of 6 at once.
start kill2 6 --iters "$ITERS"
at_step kill2 20
kill -KILL "$(pid_of 1)" "$(pid_of 4)"
wait_all 120
codes_are "0 137 0 0 137 0" kill2
t_ok $? "SIGKILL of peers 1 and 4 of 6: the 4 others finish with exit 0"
grep -q '"left": \[1,4\]' "$TMP/kill2.metrics" ||
    grep -q '"left": \[1\]' "$TMP/kill2.metrics"
t_ok $? "the metrics hold the view change record"
counted kill2 "$ITERS" $((6 * BATCH))
t_ok $? "two SIGKILLs: every step once, every sample once per epoch"

# 3. SIGKILL of one peer, then of another during the next view's first
# steps: two view changes in a row.
start kill12 6 --iters "$ITERS"
at_step kill12 10
kill -KILL "$(pid_of 5)"
wait_for "$TMP/kill12.p0.log" "view 1:" 60
kill -KILL "$(pid_of 2)"
wait_all 120
codes_are "0 0 137 0 0 137" kill12
t_ok $? "two SIGKILLs one after the other: the 4 others finish"
counted kill12 "$ITERS" $((6 * BATCH))
t_ok $? "two view changes: every step once, every sample once per epoch"

# 4. SIGSTOP of one peer: the others go on after --peer-timeout; continued
# later, it is left out of the view (exit 5), never trains on its own.
start stop1 6 --iters "$ITERS" --peer-timeout 2
at_step stop1 15
stopped=$(pid_of 2)
kill -STOP "$stopped"
wait_for "$TMP/stop1.p0.log" "view 1:" 60
t_ok $? "SIGSTOP of peer 2: the others change the view"
grep -l "view 1 decided without the settle time:.*blamed by this peer's \
mesh (slots 2)" "$TMP"/stop1.p[01345].log > /dev/null
t_ok $? "silence: a survivor's mesh blamed slot 2, which no one waited for"
kill -CONT "$stopped"
wait_all 120
codes_are "0 0 5 0 0 0" stop1
t_ok $? "the 5 others finish with 0; the continued peer exits 5"
grep -q "left out of view" "$TMP/stop1.p2.log"
t_ok $? "the continued peer says it was left out of the view"
counted stop1 "$ITERS" $((6 * BATCH))
t_ok $? "SIGSTOP: every step once, every sample once per epoch"

# 5. --min-peers: 3 peers with --min-peers 3 lose one: exit 6.
start minp 3 --iters 100000 --min-peers 3
at_step minp 5
kill -KILL "$(pid_of 0)"
wait_all 60
codes_are "137 6 6" minp
t_ok $? "a view below --min-peers 3 stops the others with exit 6"

# 6. Under meshrun --elastic: a killed rank stops nobody, meshrun reports
# the view change and exits 0.
take_ports 4
port=$PORT
# shellcheck disable=SC2086
bg "$MESHRUN" -np 4 -H localhost:4 -- "$MESHTRAIN" --port "$port" $TINY \
    --iters "$ITERS" --metrics "$TMP/run.metrics" > "$TMP/run.log" 2>&1
run=$BG_PID
at_step run 10
victim=$(rank_pid "$run" 2)
[ -n "$victim" ] && kill -KILL "$victim"
wait_exit "$run" 120
[ "$EXIT_CODE" -eq 0 ] && grep -q "meshrun: view 1: 3 rank(s) continue" \
    "$TMP/run.log"
t_ok $? "meshrun --elastic: exit 0 after rank 2 was killed, view reported \
(exit $EXIT_CODE)"
[ "$EXIT_CODE" -eq 0 ] || t_show "$TMP/run.log" 10
grep "meshrun:" "$TMP/run.log" | head -n 3 | sed 's/^/# /'

# 7. Under meshrun --elastic, a rank that stops itself (SIGSTOP at step 5)
# and is left out of the view: once the others finished, meshrun stops it
# (it would never exit) and exits 0.
take_ports 3
port=$PORT
MESHTRAIN_TEST_FAULT=2:between:5:stop
export MESHTRAIN_TEST_FAULT
# shellcheck disable=SC2086
bg "$MESHRUN" -np 3 -H localhost:3 -- "$MESHTRAIN" --port "$port" $TINY \
    --peer-timeout 3 --iters 40 > "$TMP/runstop.log" 2>&1
unset MESHTRAIN_TEST_FAULT
wait_exit "$BG_PID" 120
[ "$EXIT_CODE" -eq 0 ] && grep -q "meshrun: rank 2 (localhost), left out of \
the view, still runs after the job finished; stopping it" "$TMP/runstop.log"
t_ok $? "meshrun --elastic: a stopped rank left out is stopped at the end, \
exit 0 (exit $EXIT_CODE)"
[ "$EXIT_CODE" -eq 0 ] || t_show "$TMP/runstop.log" 10
t_done
