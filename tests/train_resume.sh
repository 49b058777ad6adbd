#!/bin/sh
# tests/train_resume.sh: exact resume. 2 peers train with a checkpoint
# every 3 steps until every peer is killed (SIGKILL) once a checkpoint
# exists; --resume continues from the newest checkpoint both peers hold and
# runs to step END (B). The same job trains END steps without a break (A).
# The final weights of A and B (parameters, BN running statistics, which
# are averaged over the peers at the end, and counters) must be
# bitwise identical. The killed run is as long as it takes to kill it (the
# learning rate does not depend on the run's length), and END comes after
# its newest checkpoint: a 10-step run, killed once its checkpoint of step
# 3 appeared, could end first on a fast machine. A run of END steps with
# no checkpoints at all (C) must end bitwise as A: a checkpoint writes the
# peers' average of the BN statistics, but training goes on from each
# peer's own (kept in the checkpoint too), as it does without one.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 7
BASE="$SMALL --data fashion-mnist --batch 16 --lr 0.05 --no-eval \
--verify-every 2 --algo ring --bucket-mb 0.5 --join-timeout 60"
COMMON="$BASE --checkpoint-every 3"

# shellcheck disable=SC2086
by_hand 2 "$TMP/b" $COMMON --iters 1000000 --checkpoint-dir "$TMP/ck"
killed=1
i=0
while [ $i -lt 3000 ]; do
    if [ -d "$TMP/ck/rank-0/ckpt-000000003" ] &&
       [ -d "$TMP/ck/rank-1/ckpt-000000003" ]; then
        for p in $PEERS; do kill -KILL "$p" 2>/dev/null; done
        killed=0
        break
    fi
    sleep 0.1
    i=$((i + 1))
done
wait_all 30
[ "$CODES" = "137 137" ] || killed=1
t_ok $killed "both peers killed after the checkpoint of step 3 appeared \
(exit codes $CODES)"
t_diag "checkpoints when killed: $(ls "$TMP/ck/rank-0" | tr '\n' ' ')"
# the newest checkpoint of either peer, and 7 steps more (at least 10)
newest=$(ls "$TMP/ck/rank-0" "$TMP/ck/rank-1" |
         sed -n 's/^ckpt-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 1)
END=$(( ${newest:-3} + 7 ))

# shellcheck disable=SC2086
by_hand 2 "$TMP/a" $COMMON --iters $END --checkpoint-dir "$TMP/cka" \
    --save "$TMP/a.st"
wait_all 600
[ "$CODES" = "0 0" ]
t_ok $? "uninterrupted run of $END steps (exit codes $CODES)"

# shellcheck disable=SC2086
by_hand 2 "$TMP/c" $COMMON --iters $END --checkpoint-dir "$TMP/ck" \
    --resume --save "$TMP/b.st"
wait_all 600
[ "$CODES" = "0 0" ]
t_ok $? "resumed run (exit codes $CODES)"
from=$(sed -n 's/.*resumed from step \([0-9]*\).*/\1/p' "$TMP/c0.log" |
       head -n 1)
[ -n "$from" ] && [ "$from" -ge 3 ] && [ "$from" -lt "$END" ]
t_ok $? "it resumed from a checkpoint before the end (step ${from:-none} \
of $END)"
[ "$CODES" = "0 0" ] || t_show "$TMP/c0.log"

cmp "$TMP/a.st" "$TMP/b.st"
t_ok $? "final weights of the resumed run are bitwise identical"

# shellcheck disable=SC2086
by_hand 2 "$TMP/p" $BASE --iters $END --save "$TMP/c.st"
wait_all 600
[ "$CODES" = "0 0" ]
t_ok $? "uninterrupted run of $END steps without checkpoints (exit codes \
$CODES)"
cmp "$TMP/a.st" "$TMP/c.st"
t_ok $? "its final weights and BN statistics are bitwise those of the run \
with checkpoints"
t_done
