#!/bin/sh
# tests/train_elastic_resume.sh: --resume from checkpoints written after a
# view change that brought every slot back (README "--resume", doc/elastic.md
# "Costs and limits"). Such a view has the peer count of the job, so its
# checkpoints are the ones to resume from, and the resumed run must end
# bitwise as the run that wrote them:
# 1. 3 of 4 slots train (a global batch of 3 micro-batches), slot 3 joins:
#    every peer's checkpoint of a step after the join has the same digest
#    (before, the joiner's BN num_batches_tracked counted only its own
#    forward passes, so no checkpoint after a join was held by all 4 and
#    --resume failed), and --resume from one ends bitwise as the run (the
#    3-peer view moved the data position off the multiples of a 4-peer
#    step; before, the resumed run recomputed it from the step number and
#    trained on other samples).
# 2. --keep-global-batch: slot 1 dies at step 5 and a new process takes it
#    back; while 3 peers share 4 micro-batches one of them runs 2 forward
#    passes a step. The same two checks.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 4
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:301 --num-classes 10 \
--in-channels 1 --batch 3 --no-eval --verify-every 5 --elastic \
--peer-timeout 10 --iters 30 --checkpoint-every 4 --keep 10"

# peer NAME LOG SLOT ARGS...: start slot SLOT of job NAME's 4 slots by
# hand (checkpoints in $TMP/NAME.ck, log $TMP/LOG.SLOT.log), with the
# environment $ENVS.
peer() {
    _name=$1
    _log=$2
    _r=$3
    shift 3
    # shellcheck disable=SC2086
    bg env $ENVS "$MESHTRAIN" -H localhost:4 --rank "$_r" --port "$BASE" \
        --secret-file "$TMP/secret" $TINY --checkpoint-dir "$TMP/$_name.ck" \
        "$@" < /dev/null > "$TMP/$_log.$_r.log" 2>&1
    PEERS="$PEERS $BG_PID"
}

# check NAME FROM: the checkpoints of step 28 agree on every rank; keep
# those up to FROM, resume with all 4 slots, compare the saved weights.
check() {
    _digests=$(sed -n 's/^digest //p' "$TMP/$1".ck/rank-*/ckpt-000000028/MANIFEST |
               sort -u | wc -l)
    _n=$(ls -d "$TMP/$1".ck/rank-*/ckpt-000000028 2>/dev/null | wc -l)
    t_ok "$([ "$CODES" = "0 0 0 0" ] && [ "$_n" -eq 4 ] &&
           [ "$_digests" -eq 1 ]; echo $?)" \
        "$1: the run ends (exits $CODES); its 4 checkpoints of step 28 \
have one digest ($_digests)"
    for _c in "$TMP/$1".ck/rank-*/ckpt-*; do
        _s=$(basename "$_c" | sed 's/^ckpt-0*//')
        [ "${_s:-0}" -gt "$2" ] && rm -rf "$_c"
    done
    PEERS=""
    ENVS=""
    for _r in 0 1 2 3; do
        peer "$1" "$1.b" "$_r" --resume --join-timeout 60 \
            --save "$TMP/$1.b.st"
    done
    wait_all 300
    _from=$(sed -n 's/.*resumed from step \([0-9]*\).*/\1/p' "$TMP/$1.b.0.log")
    t_ok "$([ "$CODES" = "0 0 0 0" ] && [ "$_from" = "$2" ] &&
           cmp -s "$TMP/$1.st" "$TMP/$1.b.st"; echo $?)" \
        "$1: --resume from step ${_from:-none} (of $2) ends bitwise as the \
run (exits $CODES)"
    [ "$CODES" = "0 0 0 0" ] || grep -hv '] info: ' "$TMP/$1".b.*.log |
        tail -n 4 | sed 's/^/#   /'
}

# 1. slot 3 comes at step 3 (the others wait for it at step 12)
take_ports 4 || t_skip_all "no free ports"
BASE=$PORT
make_secret "$TMP/secret"
PEERS=""
ENVS="MESHTRAIN_TEST_JOIN_AT=12"
for r in 0 1 2; do
    peer join join "$r" --join-timeout 3 --save "$TMP/join.st" \
        --metrics "$TMP/join.metrics"
done
at_step join 3
ENVS=""
peer join join 3 --join-timeout 60 --save "$TMP/join.st" \
    --metrics "$TMP/join.metrics"
wait_all 300
check join 24

# 2. --keep-global-batch: slot 1 killed at step 5, back at step 9
take_ports 4
BASE=$PORT
TINY="$TINY --keep-global-batch"
PEERS=""
ENVS="MESHTRAIN_TEST_FAULT=1:between:5 MESHTRAIN_TEST_JOIN_AT=9"
for r in 0 1 2 3; do
    peer kgb kgb "$r" --join-timeout 30 --save "$TMP/kgb.st" \
        --metrics "$TMP/kgb.metrics"
done
# shellcheck disable=SC2086
set -- $PEERS
wait_exit "$2" 120
PEERS="$1 $3 $4"
ENVS=""
peer kgb kgb 1 --join-timeout 60 --save "$TMP/kgb.st" \
    --metrics "$TMP/kgb.metrics"
wait_all 300
# shellcheck disable=SC2086
set -- $CODES
CODES="$1 $4 $2 $3"
check kgb 20
t_done
