#!/bin/sh
# tests/train_elastic_slowlink.sh: a joiner whose catch-up cannot keep up
# takes the whole state (train/catchup.c, cu_worth; doc/elastic.md,
# "Catching up", Faults). Two members share host 1 (their all-reduce over
# shared memory, steps of 50 ms at least); slot 2 joins from host 2, and
# host 1's egress is shaped by tbf to 512 kbit/s: the snapshot of the
# 0.36 MB state takes 5 s, while each step's gradient (half of it) takes
# the link about 50 times a member's step. 2 s into the snapshot
# the joiner gives up, naming the rate and the fraction, and is admitted
# with the whole state in the view change. Every peer exits 0: the
# state's SHA-256 in the view change and the weight digests after it and
# at the end prove the joiner's state equals the members' bitwise; every
# step once, every sample of each epoch once. (The links are unshaped
# once it joined.) Skips, with the reason,
# without root, iproute2, tc or namespace support.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
command -v tc > /dev/null || t_skip_all "tc (iproute2) not found"
t_netns_up s 2 --rate 512kbit --latency 500ms

t_plan 3
N=1200
# long enough on a fast machine (15 s at 50 ms a step) for the joiner's
# 2 s of snapshot, its model, and the whole state (6 s); the members
# also wait at step ITERS - 2 for it (MESHTRAIN_TEST_JOIN_AT)
ITERS=300
A="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout 30 --iters $ITERS --seed 5"
printf '10.77.0.1 slots=2\n10.77.0.2 slots=1\n' > "$TMP/hosts"
make_secret "$TMP/secret"
PEERS=""
for r in 0 1; do
    # shellcheck disable=SC2086
    MESHTRAIN_TEST_SAMPLES=$TMP/samples MESHTRAIN_TEST_STEP_MS=50 \
        MESHTRAIN_TEST_JOIN_AT=$((ITERS - 2)) bg ip netns exec \
        "${PREFIX}1" "$MESHTRAIN" --hostfile "$TMP/hosts" --rank $r \
        --port 29500 --secret-file "$TMP/secret" $A --join-timeout 3 \
        --metrics "$TMP/metrics" > "$TMP/p$r.log" 2>&1
    PEERS="$PEERS $BG_PID"
done
wait_for "$TMP/metrics" '"step": 10,' 120
# shellcheck disable=SC2086
MESHTRAIN_TEST_SAMPLES=$TMP/samples bg ip netns exec "${PREFIX}2" \
    "$MESHTRAIN" --hostfile "$TMP/hosts" --rank 2 --port 29500 \
    --secret-file "$TMP/secret" $A --join-timeout 120 \
    > "$TMP/p2.log" 2>&1
PEERS="$PEERS $BG_PID"
# admitted, the joiner's all-reduce would cross the shaped link at every
# step: the links are freed for the rest of the job
wait_for "$TMP/p2.log" "slot 2 joined view" 300
for h in 1 2; do
    ip netns exec "$PREFIX$h" tc qdisc del dev eth0 root > /dev/null 2>&1
done
wait_all 300
[ "$CODES" = "0 0 0" ] && grep -q "slot 2 joined view" "$TMP/p2.log"
t_ok $? "slot 2 joins 2 members over a 512 kbit/s link (exit codes $CODES)"
[ "$CODES" = "0 0 0" ] || for r in 0 1 2; do
    t_diag "p$r.log:"
    grep -v "info:" "$TMP/p$r.log" | tail -n 3 | cut -c 1-300 |
        sed 's/^/#   /'
done
_state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' "$TMP/metrics" |
    tail -n 1)
_got=$(sed -n 's/.*slot 2 joined view [0-9]*: .* state \([0-9]*\) bytes.*/\1/p' \
    "$TMP/p2.log")
grep -q "catch-up: given up [0-9.]* s into the snapshot" "$TMP/p2.log" &&
    [ -n "$_state" ] && [ "${_got:-0}" = "$_state" ]
t_ok $? "the joiner gave up its catch-up and received the whole state \
(${_got:-?} of ${_state:-?} bytes)"
grep -h "catch-up: given up" "$TMP/p2.log" | cut -c 1-300 | sed 's/^/# /'
python3 "$top_srcdir/tests/train_elastic_count.py" "$TMP/metrics" $ITERS $N \
    12 "$TMP"/samples.*
t_ok $? "every step once, every sample of each epoch once"
t_done
