#!/bin/sh
# tests/gpu/elastic_catchup.sh: a joiner catches up on the GPU while the
# job trains (doc/elastic.md, "Catching up", "On a device backend"). Two of
# three --elastic slots train on one GPU (--device cuda); the third starts
# at step 20. The members serve stripes of the host copy of their
# boundary's snapshot and download each step's reduced gradient; the
# joiner loads the snapshot into the GPU from its catch-up thread and
# replays the steps with the members' SGD kernel, then is admitted with
# only what it could not rebuild (the header and the BN statistics).
# Checks:
#   - every peer exits 0: the state's SHA-256 in the view change, and the
#     weight digests every 10 steps and at the end, prove the joiner's
#     weights and momentum bitwise equal to the members';
#   - the joiner's "caught up in the background" line, a snapshot of a
#     step at or before the one it was admitted at, and the view change
#     sent it under a tenth of the state;
#   - rank 0's metrics name every step once and every sample of an epoch
#     is used once (tests/train_elastic_count.py).
# The members pause 30 ms at each step (MESHTRAIN_TEST_STEP_MS) so that
# the joiner's start (the CUDA libraries, a second or two) falls inside the
# run. Run by tests/gpu/run.sh on a machine with a GPU; a TAP skip without
# meshtrain's cuda device or without a GPU. ELASTIC_DEVICE=devsim runs the
# same on the GPU test double (a rehearsal on a machine without a GPU).
top_srcdir=${top_srcdir:-$(dirname "$0")/../..}
if [ ! -f "$top_srcdir/tests/train_lib.sh" ]; then
    echo "1..0 # SKIP no tests/train_lib.sh: the trainer is not in this tree"
    exit 0
fi
. "$top_srcdir/tests/train_lib.sh"

DEV=${ELASTIC_DEVICE:-cuda}
PY=${PYTHON:-python3}
command -v "$PY" > /dev/null || t_skip_all "$PY not found"
if [ "$DEV" = cuda ]; then
    "$MESHTRAIN" --help 2>&1 | grep -q 'cpu|cuda' ||
        t_skip_all "meshtrain has no --device cuda"
fi
take_ports 1
"$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure --device "$DEV" \
    --summary > "$TMP/probe.log" 2>&1 ||
    t_skip_all "no $DEV device: $(tail -n 1 "$TMP/probe.log")"

t_plan 4
N=2048
ITERS=300
RUN="--model resnet18 --width 16 --cifar-stem --image-size 16 \
--device $DEV --data synthetic:$N --num-classes 10 --batch 8 --threads 2 \
--data-threads 1 --quiet --no-eval --verify-every 10 --elastic \
--peer-timeout 10 --iters $ITERS --seed 11"

take_ports 3
make_secret "$TMP/secret"
PEERS=""
for r in 0 1; do
    # shellcheck disable=SC2086
    bg env MESHTRAIN_TEST_SAMPLES="$TMP/samples" MESHTRAIN_TEST_STEP_MS=30 \
        "$MESHTRAIN" -H localhost:3 --rank $r --port "$PORT" \
        --secret-file "$TMP/secret" $RUN --join-timeout 10 \
        --metrics "$TMP/metrics" > "$TMP/p$r.log" 2>&1
    PEERS="$PEERS $BG_PID"
done
wait_for "$TMP/metrics" '"step": 20,' 120
# shellcheck disable=SC2086
bg env MESHTRAIN_TEST_SAMPLES="$TMP/samples" "$MESHTRAIN" -H localhost:3 \
    --rank 2 --port "$PORT" --secret-file "$TMP/secret" $RUN \
    --join-timeout 60 > "$TMP/p2.log" 2>&1
PEERS="$PEERS $BG_PID"
wait_all 240

[ "$CODES" = "0 0 0" ]
t_ok $? "$DEV: 2 members and a joiner exit 0, digests equal ($CODES)"
[ "$CODES" = "0 0 0" ] || for r in 0 1 2; do t_show "$TMP/p$r.log"; done

cu=$(sed -n 's/.*a snapshot of step \([0-9]*\) .* state of step \([0-9]*\) .*/\1 \2/p' \
    "$TMP/p2.log" | tail -n 1)
state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/metrics" |
    tail -n 1)
got=$(sed -n 's/.*slot 2 joined view [0-9]*: .* state \([0-9]*\) bytes.*/\1/p' \
    "$TMP/p2.log")
# shellcheck disable=SC2086
set -- $cu
[ $# -eq 2 ] && [ "$1" -le "$2" ] && [ -n "$got" ] && [ -n "$state" ] &&
    [ $((got * 10)) -lt "$state" ]
t_ok $? "$DEV: the joiner caught up in the background (snapshot of step \
${1:-?}, admitted at step ${2:-?}; the view change sent ${got:-?} of \
${state:-?} bytes)"
grep "caught up in the background" "$TMP/p2.log" | sed 's/^/# /'

grep -q "catch-up: slot 2 is sent the snapshot of step" "$TMP/p0.log" &&
    grep -q "catch-up: slot 2 is sent the snapshot of step" "$TMP/p1.log"
t_ok $? "$DEV: both members served a stripe of their snapshot's host copy"

"$PY" "$top_srcdir/tests/train_elastic_count.py" "$TMP/metrics" "$ITERS" \
    $N 24 "$TMP"/samples.*
t_ok $? "$DEV: every step once, every sample of each epoch once"
t_done
