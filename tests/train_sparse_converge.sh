#!/bin/sh
# tests/train_sparse_converge.sh: top-k at 1 % with error feedback still
# trains. The demo's job (tests/train_converge.sh: 4 peers under meshrun, a
# ResNet-18 of width 16 with the CIFAR stem on 14 x 14 Fashion-MNIST,
# batch 32 per peer, cosine schedule) with --compress topk:0.01, for 2
# epochs instead of 3 (about 100 CPU-seconds, the budget of make check),
# must reach >= 88 % top-1 on the 10000 test images, the issue's bar for
# 3 epochs, where float32 reaches 90 %. Measured (seed 1): 89.08 % after
# 2 epochs, 90.25 % after 3; without error feedback 87.76 % after 2.
# bench/sparse_converge.sh runs the full 3 epochs beside float32.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

[ -r "$FMNIST/train-images-idx3-ubyte.gz" ] ||
    t_skip_all "no Fashion-MNIST in $FMNIST (dataset-fashion-mnist)"
t_plan 3
take_ports 4 || exit 99
port=$PORT
# shellcheck disable=SC2086
"$MESHRUN" -np 4 -H localhost:4 -- "$MESHTRAIN" --port "$port" \
    --model resnet18 --width 16 --cifar-stem --image-size 14 \
    --data fashion-mnist --batch 32 --epochs 2 --lr 0.1 \
    --lr-schedule cosine --warmup-epochs 0.1 --weight-decay 5e-4 \
    --algo ring --threads 1 --data-threads 1 --log-every 200 \
    --compress topk:0.01 --eval-every 2 --timeline "$TMP/t.json" \
    --timeline-steps 3 > "$TMP/run.log" 2>&1
rc=$?
t_ok $rc "4 peers train 2 epochs with topk:0.01 (exit $rc)"
grep -E "eval after|test accuracy" "$TMP/run.log" | sed 's/^/# /'
[ $rc -eq 0 ] || t_show "$TMP/run.log"
/usr/bin/python3 "$top_srcdir/tests/train_compare.py" top1 "$TMP/run.log" 88
t_ok $? "test top-1 >= 88 %"
# the pairs of every bucket, and nothing all-reduced
grep -q '"allgather sparse bucket 0"' "$TMP/t.json" &&
    ! grep -q '"allreduce bucket' "$TMP/t.json"
t_ok $? "the buckets' gradients were all-gathered as pairs, not all-reduced"
t_done
