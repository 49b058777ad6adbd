#!/bin/sh
# tests/train_sparse.sh: --compress topk:R and threshold:T in the trainer
# (train/sparse.h). Bad --compress values and --no-error-feedback without
# a sparse kind are refused, naming the flag. Then 3 peers train with
# topk:0.01,fp16 and error feedback, checkpointing every 2 steps:
#   A  8 steps without a break;
#   B  4 steps, then a new run that resumes from step 4 to step 8.
# The replicas stay identical (digests every step), every peer's
# checkpoint holds its own residual (nonzero, different from the others'),
# and the final weights of A and B are bitwise the same: the residual is
# restored, or B would differ. The same 8 steps with --no-error-feedback
# end with other weights (the residual is really fed back), and
# threshold:0.001,bf16 keeps 2 peers identical too, on the cpu backend and
# bitwise the same on device slabs (devsim); one peer runs; with --elastic
# the survivors of a killed peer finish; the timeline names the sparse
# all-gathers.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

[ -r "$FMNIST/train-images-idx3-ubyte.gz" ] ||
    t_skip_all "no Fashion-MNIST in $FMNIST (dataset-fashion-mnist)"
t_plan 13

# ---- flags -----------------------------------------------------------------
bad=0
for spec in topk:0 topk:1.5 topk: topk:x threshold:-1 threshold:inf \
    topk:0.1,fp16,bf16 topk:0.1,none none,topk:0.1 fp16,bf16 bogus; do
    "$MESHTRAIN" --compress "$spec" --data synthetic:8 --iters 1 \
        > "$TMP/flag.log" 2>&1
    rc=$?
    if [ $rc -ne 1 ] || ! grep -q -- "--compress" "$TMP/flag.log"; then
        t_diag "--compress $spec: exit $rc: $(cat "$TMP/flag.log")"
        bad=1
    fi
done
t_ok $bad "bad --compress values exit 1 naming --compress"
"$MESHTRAIN" --no-error-feedback --data synthetic:8 --iters 1 \
    > "$TMP/flag.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q -- "--no-error-feedback needs --compress" \
    "$TMP/flag.log"
t_ok $? "--no-error-feedback without topk or threshold: exit 1 ($rc)"

# ---- resume exact ------------------------------------------------------------
COMMON="$SMALL --data fashion-mnist --batch 16 --lr 0.05 --no-eval \
--verify-every 1 --algo ring --bucket-mb 0.5 --join-timeout 60 \
--compress topk:0.01,fp16"

# shellcheck disable=SC2086
by_hand 3 "$TMP/a" $COMMON --iters 8 --checkpoint-every 2 \
    --checkpoint-dir "$TMP/cka" --save "$TMP/a.st" --timeline "$TMP/t.json" \
    --timeline-steps 2
wait_all 300
[ "$CODES" = "0 0 0" ]
t_ok $? "3 peers, topk:0.01,fp16, 8 steps: digests agree every step \
(exit $CODES)"
[ "$CODES" = "0 0 0" ] || t_show "$TMP/a0.log"

# shellcheck disable=SC2086
by_hand 3 "$TMP/b" $COMMON --iters 4 --checkpoint-every 2 \
    --checkpoint-dir "$TMP/ckb"
wait_all 300
# shellcheck disable=SC2086
by_hand 3 "$TMP/c" $COMMON --iters 8 --checkpoint-every 2 \
    --checkpoint-dir "$TMP/ckb" --resume --save "$TMP/b.st"
wait_all 300
from=$(sed -n 's/.*resumed from step \([0-9]*\).*/\1/p' "$TMP/c0.log" |
       head -n 1)
[ "$CODES" = "0 0 0" ] && [ "$from" = 4 ]
t_ok $? "stopped after 4 steps, resumed from step ${from:-none} to 8 \
(exit $CODES)"
[ "$CODES" = "0 0 0" ] || t_show "$TMP/c0.log"

/usr/bin/python3 - "$TMP/ckb" <<'PY' > "$TMP/res.txt"
import glob, struct, sys
blobs = []
for r in range(3):
    f = glob.glob("%s/rank-%d/ckpt-000000004/residual" % (sys.argv[1], r))
    if not f:
        print("# rank %d: no residual blob" % r)
        sys.exit(1)
    blobs.append(open(f[0], "rb").read())
n = len(blobs[0]) // 4
nz = [sum(1 for x in struct.unpack("%df" % n, b) if x != 0) for b in blobs]
print("# residual: %d floats per peer, nonzero %s" % (n, nz))
ok = all(len(b) == len(blobs[0]) for b in blobs) and min(nz) > n // 2 \
    and len(set(blobs)) == 3
sys.exit(0 if ok else 1)
PY
rc=$?
cat "$TMP/res.txt"
t_ok $rc "every peer's checkpoint holds its own residual"

cmp "$TMP/a.st" "$TMP/b.st"
t_ok $? "the resumed run's final weights are bitwise the uninterrupted one's"

# ---- error feedback off, threshold -------------------------------------------
# shellcheck disable=SC2086
by_hand 3 "$TMP/d" $COMMON --iters 8 --no-error-feedback --save "$TMP/d.st"
wait_all 300
[ "$CODES" = "0 0 0" ] && ! cmp -s "$TMP/a.st" "$TMP/d.st"
t_ok $? "--no-error-feedback: other final weights (exit $CODES)"

COMMON2="$SMALL --data fashion-mnist --batch 16 --lr 0.05 --no-eval \
--verify-every 1 --algo ring --bucket-mb 0.5 --join-timeout 60 --iters 4"
# shellcheck disable=SC2086
by_hand 2 "$TMP/e" $COMMON2 --compress threshold:0.001,bf16 --save "$TMP/e.st"
wait_all 300
[ "$CODES" = "0 0" ]
t_ok $? "2 peers, threshold:0.001,bf16: digests agree every step \
(exit $CODES)"
[ "$CODES" = "0 0" ] || t_show "$TMP/e0.log"

# shellcheck disable=SC2086
by_hand 2 "$TMP/f" $COMMON2 --save "$TMP/f.st"
wait_all 300
[ "$CODES" = "0 0" ] && ! cmp -s "$TMP/e.st" "$TMP/f.st"
t_ok $? "threshold:0.001,bf16 ends with other weights than none \
(exit $CODES)"

# device slabs (the GPU test double): buckets selected on the host
# shellcheck disable=SC2086
by_hand 2 "$TMP/g" $COMMON2 --compress threshold:0.001,bf16 --device devsim \
    --save "$TMP/g.st"
wait_all 300
[ "$CODES" = "0 0" ] && cmp "$TMP/e.st" "$TMP/g.st"
t_ok $? "--device devsim: bitwise the cpu run's weights (exit $CODES)"

# shellcheck disable=SC2086
"$MESHTRAIN" $COMMON2 --compress topk:0.01 --save "$TMP/one.st" \
    > "$TMP/one.log" 2>&1
rc=$?
[ $rc -eq 0 ] && [ -s "$TMP/one.st" ]
t_ok $? "one peer with topk:0.01 (exit $rc)"
[ $rc -eq 0 ] || t_show "$TMP/one.log"

# --elastic: a peer killed mid-run; the survivors roll back to a snapshot
# (which holds their residuals), go on as a new view and finish, their
# digests agreeing after the view change and at the end
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:600 --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 5 --elastic \
--peer-timeout 2 --join-timeout 60 --compress topk:0.05,fp16"
# the kill comes at step 10 of 40 from this script, so the job must still
# run then, however fast the machine: steps of 50 ms at least
# (MESHTRAIN_TEST_STEP_MS) leave 1.5 s; without, the 40 steps took 0.2 s
# here and the kill landed at step 15 to 31
MESHTRAIN_TEST_STEP_MS=50
export MESHTRAIN_TEST_STEP_MS
# shellcheck disable=SC2086
by_hand 3 "$TMP/el" $TINY --iters 40 --metrics "$TMP/el.metrics"
unset MESHTRAIN_TEST_STEP_MS
wait_for "$TMP/el.metrics" '"step": 10,' 120
# shellcheck disable=SC2086
set -- $PEERS
kill -KILL "$3"
wait_all 120
[ "$CODES" = "0 0 137" ] && grep -q "view 1:" "$TMP/el0.log" &&
    grep -q '"step": 40,' "$TMP/el.metrics"
t_ok $? "--elastic with topk:0.05,fp16: peer 2 killed, the others finish \
(exit $CODES)"
[ "$CODES" = "0 0 137" ] || t_show "$TMP/el0.log"

grep -q '"allgather sparse bucket 1", "cat": "communication"' "$TMP/t.json"
t_ok $? "the timeline names the sparse all-gathers"
t_done
