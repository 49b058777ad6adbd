#!/bin/sh
# tests/train_elastic_restart.sh: meshrun --restarts brings a dead rank
# back (doc/elastic.md, "Joining"). 4 ranks train under meshrun --elastic
# --restarts 1; rank 0 is killed (SIGKILL) while they train. The other 3
# change the view and go on; meshrun starts rank 0 again on its host after
# its backoff, and the new process joins the running job, receives its
# state and takes rank 0 back (the peer it displaces stops writing the
# metrics). Training ends with all 4 slots: every rank exits 0 (meshtrain
# compares the weight digests of every peer after each view change and at
# the end, and a mismatch exits 4), rank 0's metrics end in a view of 4
# peers and name every step once, and every sample of every epoch is
# used once (tests/train_elastic_count.py). Then a slot killed twice with
# --restarts 1 is not restarted a second time, and the job still
# finishes with the others. With --max-peers 3 of 4 slots, the spare slot
# 3 is started in place of a killed rank that has no restart, joins, and
# the job ends with slots 0, 2 and 3. Ctrl-C (SIGINT) while a restart is pending
# stops every rank and starts none. Bad --restarts and --max-peers are refused
# with a message naming them, and every flag of meshrun --help is in its
# man page and the README. A joiner that comes late (a loaded machine) is
# waited for near the end ($LATE below), so that the job cannot end without
# it; a failed check shows meshrun's lines, the view records and the
# ranks' last lines. When no member of the job's view is left (3 slots:
# two killed in turn, the last one alone has no quorum), meshrun starts
# none again (the restarted processes would start a new job from step 0),
# stops those waiting to join, and exits 5.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
t_plan 12
N=1200
BATCH=8
ITERS=${ELASTIC_ITERS:-300}
TINY="--model resnet18 --width 8 --cifar-stem --image-size 16 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch $BATCH --no-eval --verify-every 10 --elastic \
--peer-timeout 10 --join-timeout 60 --iters $ITERS"

# The job is ITERS steps long, and a process started again (or a spare)
# comes after meshrun's 1 s backoff, its start and its catch-up: on a
# loaded machine the members could finish before it asks to join, and the
# job would end without it. So the members wait at step $LATE for a joiner
# that has not come by then (MESHTRAIN_TEST_JOIN_AT, up to 60 s; none
# waits once one was admitted): it joins as a rule long before, catching
# up while they train; a late one is admitted there.
LATE=$((ITERS - 10))

# run NAME [JOIN_AT]: 4 ranks under meshrun --restarts 1; $RUN is
# meshrun's pid. JOIN_AT: the members wait there for a joiner.
run() {
    rm -f "$TMP/$1".*
    take_ports 4 || return 1
    # shellcheck disable=SC2086
    bg env MESHTRAIN_TEST_SAMPLES="$TMP/$1.samples" \
        ${2:+MESHTRAIN_TEST_JOIN_AT=$2} "$MESHRUN" \
        --restarts 1 -H localhost:4 -- "$MESHTRAIN" --port "$PORT" $TINY \
        --metrics "$TMP/$1.metrics" > "$TMP/$1.log" 2>&1
    RUN=$BG_PID
}

# check STATUS NAME: t_ok, and fail=1 when STATUS is not 0.
check() {
    [ "$1" -eq 0 ] || fail=1
    t_ok "$@"
}

# show NAME: after a failed check, what tells why: meshrun's lines, the
# view records of rank 0's metrics and each rank's last lines other than
# info (the count script's output is always shown).
show() {
    t_diag "meshrun's lines ($TMP/$1.log):"
    grep "^meshrun:" "$TMP/$1.log" | sed 's/^/#   /'
    t_diag "view records:"
    grep '"event": "\(view\|transfer\)"' "$TMP/$1.metrics" | cut -c 1-220 |
        sed 's/^/#   /'
    t_diag "the ranks' last lines but info:"
    grep -v "^meshrun:\|] info: " "$TMP/$1.log" | tail -n 20 | cut -c 1-300 |
        sed 's/^/#   /'
    return 0
}

# kill_rank NAME R: SIGKILL the process of rank R.
kill_rank() {
    _pid=$(rank_pid "$RUN" "$2")
    [ -n "$_pid" ] && kill -KILL "$_pid"
}

# 0. the flags: bad values are refused before anything starts (exit 1),
# naming the flag; --help, the man page and the README list every flag.
bad=0
for args in "--restarts 1 -np 2 -- true" "--elastic --restarts x -np 2 -- true" \
    "--elastic --restarts -1 -np 2 -- true" \
    "--elastic --max-peers 3 -H localhost:2 -- true" \
    "--elastic --max-peers 2 --min-peers 3 -H localhost:4 -- true"; do
    flag=$(echo "$args" | sed 's/.*\(--restarts\|--max-peers\).*/\1/')
    # shellcheck disable=SC2086
    "$MESHRUN" $args > "$TMP/bad.log" 2>&1
    code=$?
    if [ $code -ne 1 ] || ! grep -q -- "meshrun: .*$flag" "$TMP/bad.log"; then
        t_diag "meshrun $args: exit $code: $(head -n 1 "$TMP/bad.log")"
        bad=1
    fi
done
t_ok $bad "bad --restarts and --max-peers: exit 1 naming the flag"
missing=""
for f in $("$MESHRUN" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
    grep -q -- "$(echo "$f" | sed 's/-/\\\\-/g')" "$top_srcdir/man/meshrun.1" ||
        missing="$missing man:$f"
    grep -q -- "\`$f" "$top_srcdir/README.md" || missing="$missing README:$f"
done
t_ok $([ -z "$missing" ]; echo $?) "every flag of meshrun --help is in \
man/meshrun.1 and README.md${missing:+ (missing:$missing)}"

# 1. rank 0 killed at step 5: restarted, rejoins, all 4 finish.
run back "$LATE"
at_step back 5
kill_rank back 0
wait_exit "$RUN" 180
fail=0
grep -q "meshrun: restarting rank 0 (localhost) in 1 s (restart 1 of 1)" \
    "$TMP/back.log" &&
    grep -q "meshrun: rank 0 (localhost) started again (restart 1 of 1)" \
        "$TMP/back.log"
check $? "meshrun --restarts 1 starts the killed rank 0 again after 1 s"
[ "$EXIT_CODE" -eq 0 ] &&
    grep -q "meshrun: 4 of 4 rank(s) finished" "$TMP/back.log"
check $? "training ends with all 4 slots, every rank exits 0 (digests \
equal; meshrun exit $EXIT_CODE)"
# the last view record: every slot
tail_view=$(grep '"event": "view"' "$TMP/back.metrics" | tail -n 1)
echo "$tail_view" | grep -q '"peers": 4, "members": \[0,1,2,3\]'
check $? "the last view change admits slot 0 again: 4 peers"
$COUNT "$TMP/back.metrics" "$ITERS" $N $((4 * BATCH)) "$TMP"/back.samples.* \
    > "$TMP/back.count" 2>&1
check $? "every step once in the metrics, every sample once per epoch"
cat "$TMP/back.count"
[ $fail -eq 0 ] || show back

# 2. --restarts 1 is per slot: rank 1 killed again after its restart is
# not started a third time; the others finish. (A late joiner is waited
# for halfway, not at $LATE: the second kill must come before the end.)
run twice $((ITERS / 2))
at_step twice 5
kill_rank twice 1
wait_for "$TMP/twice.log" "rank 1 \(localhost\) started again" 60
wait_for "$TMP/twice.metrics" '"members": \[0,1,2,3\]' 120
kill_rank twice 1
wait_exit "$RUN" 180
fail=0
grep -q "meshrun: rank 1 (localhost) used up its 1 restart(s), and no \
spare slot is left" "$TMP/twice.log" &&
    [ "$(grep -c "rank 1 (localhost) started again" "$TMP/twice.log")" \
        -eq 1 ]
check $? "a slot killed after its one restart is not started again"
[ "$EXIT_CODE" -eq 0 ] &&
    grep -q "meshrun: 3 of 4 rank(s) finished" "$TMP/twice.log"
check $? "the 3 others finish; meshrun exits 0 (exit $EXIT_CODE)"
[ $fail -eq 0 ] || show twice

# 3. --max-peers 3 of 4 slots, no restarts: slots 0-2 form view 0 after
# their 3 s join timeout; rank 1 killed: spare slot 3 starts in its place.
rm -f "$TMP"/spare.*
take_ports 4
# shellcheck disable=SC2086
bg env MESHTRAIN_TEST_SAMPLES="$TMP/spare.samples" \
    MESHTRAIN_TEST_JOIN_AT="$LATE" "$MESHRUN" \
    --max-peers 3 -H localhost:4 -- "$MESHTRAIN" --port "$PORT" $TINY \
    --join-timeout 3 --metrics "$TMP/spare.metrics" > "$TMP/spare.log" 2>&1
RUN=$BG_PID
at_step spare 5
started=$(ps -o pid= --ppid "$RUN" | wc -l)
kill_rank spare 1
wait_exit "$RUN" 180
fail=0
grep -q "meshrun: rank 1 (localhost) used up its 0 restart(s); starting \
spare slot 3 (localhost)" "$TMP/spare.log" && [ "$started" -eq 3 ] &&
    grep -q "meshrun: spare slot 3 (localhost) started" "$TMP/spare.log"
check $? "--max-peers 3 starts 3 of 4 slots ($started), then the spare in \
place of the killed rank 1"
tail_view=$(grep '"event": "view"' "$TMP/spare.metrics" | tail -n 1)
[ "$EXIT_CODE" -eq 0 ] &&
    grep -q "meshrun: 3 of 4 rank(s) finished" "$TMP/spare.log" &&
    echo "$tail_view" | grep -q '"members": \[0,2,3\]' &&
    $COUNT "$TMP/spare.metrics" "$ITERS" $N $((3 * BATCH)) \
        "$TMP"/spare.samples.* > "$TMP/spare.count" 2>&1
check $? "slots 0, 2 and 3 finish (exit $EXIT_CODE); every step and \
sample once"
[ -f "$TMP/spare.count" ] && cat "$TMP/spare.count"
[ $fail -eq 0 ] || show spare

# 4. SIGINT to meshrun while a restart waits: every rank stops, none is
# started again, meshrun exits 130.
# The signal must come within the restart's 1 s: meshrun is stopped
# (SIGSTOP) once it says it waits, and gets SIGINT before it goes on; a
# try where this script came too late (the rank started again before the
# stop) is run again.
try=0
while :; do
    run intr
    at_step intr 3
    pids=$(ps -o pid= --ppid "$RUN")
    kill_rank intr 3
    wait_for "$TMP/intr.log" "restarting rank 3" 30
    kill -STOP "$RUN"
    try=$((try + 1))
    grep -q "started again" "$TMP/intr.log" && [ $try -lt 3 ] || break
    t_diag "try $try: rank 3 started again before meshrun was stopped"
    # shellcheck disable=SC2046
    kill -KILL "$RUN" $(ps -o pid= --ppid "$RUN")
    wait "$RUN" 2> /dev/null
done
kill -INT "$RUN"
kill -CONT "$RUN"
wait_exit "$RUN" 60
sleep 2 # past the restart's due time
left=0
for p in $pids; do kill -0 "$p" 2> /dev/null && left=$((left + 1)); done
[ "$EXIT_CODE" -eq 130 ] && [ $left -eq 0 ] &&
    ! grep -q "started again" "$TMP/intr.log"
t_ok $? "Ctrl-C while a restart waits: exit 130 ($EXIT_CODE), no rank \
left running ($left), none started again"

# The job lost: slot 1 killed at step 5, slot 2 at step 6 of the view of
# slots 0 and 2 (long before slot 1's restart can join), so slot 0 alone
# has no quorum (exit 5) while slots 1 and 2 wait to join.
take_ports 3
# shellcheck disable=SC2086
bg env MESHTRAIN_TEST_FAULT=1:between:5,2:between:6 "$MESHRUN" --restarts 2 \
    -H localhost:3 -- "$MESHTRAIN" --port "$PORT" $TINY --peer-timeout 3 \
    > "$TMP/lost.log" 2>&1
RUN=$BG_PID
pids=$(ps -o pid= --ppid "$RUN")
wait_exit "$RUN" 120
sleep 1
left=0
for p in $pids $(ps -o pid= --ppid "$RUN" 2> /dev/null); do
    kill -0 "$p" 2> /dev/null && left=$((left + 1))
done
[ "$EXIT_CODE" -eq 5 ] && [ $left -eq 0 ] &&
    grep -q "no member of the job's view runs any more" "$TMP/lost.log"
t_ok $? "no member left: no restart, the joiners stopped, exit 5 \
($EXIT_CODE), no rank left running ($left)"
[ "$EXIT_CODE" -eq 5 ] || grep "^meshrun" "$TMP/lost.log" | sed 's/^/#   /'
t_done
