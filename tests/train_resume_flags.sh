#!/bin/sh
# tests/train_resume_flags.sh: --resume is exact with the flags that keep
# state between steps or depend on the step number (README "--resume"):
# Nesterov momentum with a cosine schedule and warmup, --accumulate with a
# step schedule, bf16-amp with label smoothing, and sparse gradients
# (topk, whose error feedback is each peer's own). For each, 2 peers run
# 14 steps through (A); the same job, every peer killed at step 9 after a
# checkpoint every 4 steps (B), then --resume to step 14 (C): C resumes
# from step 8 and its saved weights are bitwise A's. (--elastic, whose
# test aid MESHTRAIN_TEST_FAULT kills a peer at a given step; the data set
# of 37 samples makes several epochs, none a multiple of the batch.)
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 4
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:37 --num-classes 10 \
--in-channels 1 --batch 3 --no-eval --verify-every 2 --elastic \
--iters 14 --checkpoint-every 4 --join-timeout 60"

n=0
for flags in "--nesterov --lr-schedule cosine --warmup-epochs 1" \
    "--accumulate 2 --lr-schedule step --milestones 2" \
    "--precision bf16-amp --label-smoothing 0.1" "--compress topk:0.1"; do
    n=$((n + 1))
    take_ports 2 || { t_ok 1 "no free ports"; continue; }
    d=$TMP/c$n
    # shellcheck disable=SC2086
    "$MESHRUN" --elastic -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY $flags \
        --checkpoint-dir "$d.a" --save "$d.a.st" > "$d.a.log" 2>&1
    a=$?
    # shellcheck disable=SC2086
    MESHTRAIN_TEST_FAULT=0:between:9,1:between:9 "$MESHRUN" --elastic \
        -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY $flags \
        --checkpoint-dir "$d.b" > "$d.b.log" 2>&1
    b=$?
    # shellcheck disable=SC2086
    "$MESHRUN" --elastic -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY $flags \
        --checkpoint-dir "$d.b" --resume --save "$d.c.st" > "$d.c.log" 2>&1
    c=$?
    from=$(sed -n 's/.*resumed from step \([0-9]*\).*/\1/p' "$d.c.log" |
           head -n 1)
    t_ok "$([ $a -eq 0 ] && [ $b -ne 0 ] && [ $c -eq 0 ] &&
           [ "$from" = 8 ] && cmp -s "$d.a.st" "$d.c.st"; echo $?)" \
        "$flags: killed at step 9, resumed from step ${from:-none}: \
bitwise the run through (exits $a $b $c)"
    [ $c -eq 0 ] || grep -v '] info: ' "$d.c.log" | tail -n 4 |
        sed 's/^/#   /'
done
t_done
