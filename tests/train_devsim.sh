#!/bin/sh
# tests/train_devsim.sh: the trainer's GPU path (device slabs, the
# pinned-host pipeline in chunks) on --device devsim, the GPU test double
# (nn/devsim.c: cpu compute, copies on a FIFO copy thread, or newest first
# under MESHTRAIN_DEVSIM_COPY_ORDER=lifo, each delayed by
# MESHTRAIN_DEVSIM_COPY_US, destinations NaN until the copy lands), against
# the same peers on --device cpu (host slabs, whole buckets).
#
# Equality. With 2 peers each all-reduced element is (a + b) / 2 whatever
# the algorithm and the chunking (float addition commutes), and devsim
# computes exactly what cpu computes, so the final weights, BN statistics
# and per-step losses must be bitwise equal: a chunk read before its copy
# to the host landed, an optimizer step before a copy back, a chunk sent
# twice, lost or paired with another chunk on the other peer (started in
# another order: the run with copies finishing newest first), all change
# bytes. The same holds with --compress fp16
# (devsim narrows and widens on the "device" with its own
# round-to-nearest-even code, cpu with the collective's) and with
# --accumulate 2 (the 1/2 scale on the device against on the host).
#
# One process on a device has no pipeline: its buckets are downloaded,
# scaled by 1/--accumulate and rounded to --compress's 16 bits on the
# host, and uploaded again; bitwise cpu's too.
#
# 3 peers: the ring adds three values in an order set by each element's
# place in its collective, and chunks are not buckets, so elements are
# added in other orders: a few ulp per gradient element, amplified by the
# network over the steps as in train_equiv.sh (measured: 3e-8 relative
# after 3 steps). Tolerance 1e-6 there. The wrong pipelines tried on
# purpose (no wait for a copy out, no copy_order before the optimizer,
# all-reduces started in the order copies finish) did not get that far:
# NaN losses, digests that differ between the peers, or a desync, so the
# runs themselves fail.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

take_ports 1
"$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure \
    --device devsim --summary > "$TMP/probe.log" 2>&1 ||
    t_skip_all "no devsim backend: $(tail -n 1 "$TMP/probe.log")"

t_plan 18
# 2 copies of 0.5 ms per chunk, about 30 chunks of 0.1 MiB per step
MESHTRAIN_DEVSIM_COPY_US=${DEVSIM_COPY_US:-500}
export MESHTRAIN_DEVSIM_COPY_US
COMMON="$SMALL --data fashion-mnist --batch 8 --lr 0.05 --iters 3 \
--no-eval --verify-every 1 --join-timeout 60 --bucket-mb 0.5"
DEV="--device devsim --chunk-mb 0.1"

# run N TAG ARGS...: N peers; weights in TAG.st, losses in TAG.jsonl
run() {
    _n=$1
    _tag=$2
    shift 2
    # shellcheck disable=SC2086
    by_hand "$_n" "$TMP/$_tag." $COMMON --save "$TMP/$_tag.st" \
        --metrics "$TMP/$_tag.jsonl" "$@"
    wait_all 300
    _want=$(seq "$_n" | sed 's/.*/0/' | tr '\n' ' ')
    [ "$CODES " = "$_want" ]
    t_ok $? "$_tag: $_n peer(s) train 3 steps (exit codes $CODES)"
    [ "$CODES " = "$_want" ] || t_show "$TMP/$_tag.0.log"
}

# same A B WHAT: bitwise equal weights and losses
same() {
    cmp -s "$TMP/$1.st" "$TMP/$2.st" &&
        /usr/bin/python3 "$top_srcdir/tests/train_compare.py" loss \
            "$TMP/$1.jsonl" "$TMP/$2.jsonl" 0 > "$TMP/cmp" 2>&1
    rc=$?
    t_ok $rc "$3: devsim's weights and losses bitwise equal to cpu's"
    [ $rc -eq 0 ] || { t_show "$TMP/cmp"; /usr/bin/python3 \
        "$top_srcdir/tests/train_compare.py" weights "$TMP/$1.st" \
        "$TMP/$2.st" 0 | sed 's/^/#   /'; }
}

run 2 cpu --device cpu
# shellcheck disable=SC2086
run 2 dev $DEV --timeline "$TMP/tl.json" --timeline-steps 1
same cpu dev "2 peers"
# the pipeline ran in chunks: bucket 1's second chunk went out, through
# the all-reduce and back, on their tracks
chunks_ok "$TMP/tl.json"

# copies finishing newest first (as on several streams): the all-reduces
# must still start in (bucket, chunk) order on both peers
MESHTRAIN_DEVSIM_COPY_ORDER=lifo
export MESHTRAIN_DEVSIM_COPY_ORDER
# shellcheck disable=SC2086
run 2 devlifo $DEV
unset MESHTRAIN_DEVSIM_COPY_ORDER
same cpu devlifo "copies finishing out of order"

run 2 cpu16 --device cpu --compress fp16
# shellcheck disable=SC2086
run 2 dev16 $DEV --compress fp16
same cpu16 dev16 "--compress fp16"

run 2 cpuacc --device cpu --accumulate 2
# shellcheck disable=SC2086
run 2 devacc $DEV --accumulate 2
same cpuacc devacc "--accumulate 2"

run 1 cpu1 --device cpu --accumulate 2 --compress fp16
# shellcheck disable=SC2086
run 1 dev1 $DEV --accumulate 2 --compress fp16
same cpu1 dev1 "1 peer, --accumulate 2 --compress fp16"

# 3 peers: cpu's numbers are the 2-peer runs' kind; close, not bitwise
run 3 cpu3 --device cpu --algo ring
# shellcheck disable=SC2086
run 3 dev3 $DEV --algo ring
/usr/bin/python3 "$top_srcdir/tests/train_compare.py" weights \
    "$TMP/cpu3.st" "$TMP/dev3.st" 1e-6 > "$TMP/cmp3" 2>&1
t_ok $? "3 peers: devsim's weights within 1e-6 of cpu's"
sed 's/^/# /; s/^# #/#/' "$TMP/cmp3"
t_done
