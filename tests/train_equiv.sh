#!/bin/sh
# tests/train_equiv.sh: N = 4 peers with local batch b = 8 for K = 3 steps
# against one process with --accumulate 4 over the same 4 micro-batches of
# 8 (data/data.h: one process with world 1 reads, in micro-step 4 s + r,
# exactly what peer r reads in step s), on Fashion-MNIST.
#
# Tolerance. Both compute the same float32 gradients per micro-batch (each
# micro-batch is normalised by its own BN statistics in both), but sum them
# in a different order: nn's accumulation adds g0 + g1 + g2 + g3 left to
# right and scales by 1/4, the ring all-reduce adds them starting at a
# different rank per chunk and divides by 4. Each gradient element differs
# by a few ulp (relative ~2^-22), and SGD with momentum carries that
# through the network. Measured (weights as one vector, relative Euclidean
# distance): 2e-9 after 1 step, 1e-8 after 2, 2-3e-8 after 3; then, at
# step 4 or 5 depending on the bucket layout, it jumps by orders of
# magnitude (1e-5, then 3e-4 after 6): with 8 samples per BN the network
# amplifies rounding differences chaotically, and two correct all-reduce
# algorithms (ring against tree) part by as much. So: K = 3 steps and
# 1e-6, 30 times the measured value, while a wrong gradient (a missed
# bucket, 1/N against 1/(N K), a shifted shard) is off by 1e-2 or more
# (the last check). Losses: 1e-5 relative per step.
#
# Other shapes (r31's sweep, 64 cases: 2 to 5 peers, every --algo,
# batches 1 to 7, --accumulate 1 and 2, fp32 and bf16-amp, every --model
# at width 4 or 8, --freeze, --nesterov, the lr schedules; 10 bitwise
# equal): after one step all 16 measured were within 1.1e-7 (resnet152 at
# batch 1 the largest). After two or three steps a deep or narrow network
# at a small batch parts much earlier than this one: resnet101/152 at
# width 4 and batch 2 by 1e-4 to 1e-2 after two steps, resnet18 at batch
# 3 and lr 0.1 by 1e-4 after three. That is the same chaos: there, two
# correct all-reduce algorithms part by as much (ring against tree,
# resnet101: 2e-4), and so does one process against itself with
# --weight-decay changed by 1e-5 of its value (resnet18: 1e-4).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 5
COMMON="$SMALL --data ${DATA:-fashion-mnist} \
--lr ${LR:-0.05} --iters ${ITERS:-3} --no-eval --verify-every 2 --join-timeout 60"

# shellcheck disable=SC2086
by_hand 4 "$TMP/peer" $COMMON --batch 8 --save "$TMP/peers.st" \
    --metrics "$TMP/peers.jsonl" --bucket-mb 0.5 --algo ring
wait_all 600
[ "$CODES" = "0 0 0 0" ]
t_ok $? "4 peers x batch 8 train 3 steps (exit codes $CODES)"
[ "$CODES" = "0 0 0 0" ] || t_show "$TMP/peer0.log"

take_ports 1
port=$PORT
# shellcheck disable=SC2086
"$MESHTRAIN" -H localhost:1 --port "$port" --insecure $COMMON --batch 8 \
    --accumulate 4 --save "$TMP/one.st" --metrics "$TMP/one.jsonl" \
    > "$TMP/one.log" 2>&1
rc=$?
t_ok $rc "one process, batch 8 x accumulate 4, 3 steps (exit $rc)"
[ $rc -eq 0 ] || t_show "$TMP/one.log"

/usr/bin/python3 "$top_srcdir/tests/train_compare.py" weights \
    "$TMP/peers.st" "$TMP/one.st" 1e-6
t_ok $? "weights agree within 1e-6 (relative Euclidean distance)"
/usr/bin/python3 "$top_srcdir/tests/train_compare.py" loss \
    "$TMP/peers.jsonl" "$TMP/one.jsonl" 1e-5
t_ok $? "loss curves agree step by step within 1e-5"

# A wrong setup must fail the same comparison: one process that forgets
# --accumulate (a quarter of the data per step) is far off.
# shellcheck disable=SC2086
"$MESHTRAIN" -H localhost:1 --port "$port" --insecure $COMMON --batch 8 \
    --save "$TMP/wrong.st" > "$TMP/wrong.log" 2>&1 &&
! /usr/bin/python3 "$top_srcdir/tests/train_compare.py" weights \
    "$TMP/peers.st" "$TMP/wrong.st" 1e-6
t_ok $? "the comparison tells a run without --accumulate apart"
t_done
