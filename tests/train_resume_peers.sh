#!/bin/sh
# tests/train_resume_peers.sh: checkpoints written by one peer count and
# resumed by another (README, "--resume"; doc/elastic.md, "Costs and
# limits"). 3 peers write checkpoints; --resume with 2 peers refuses them,
# naming the peer count among what differs, and with 4 finds none that
# every peer holds: both exit 1, saying why. With --elastic, after a view
# change (slot 0 killed at step 6, the others write checkpoints of a
# 2-peer view), --resume with the 3 slots goes back to the newest
# checkpoint all 3 hold (before the change) and ends bitwise as a run
# without a break; --resume with a slot missing is refused (every slot at
# the start).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 4
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:240 --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --checkpoint-every 4 --join-timeout 60"

take_ports 4 || t_skip_all "no free ports"
# shellcheck disable=SC2086
"$MESHRUN" -np 3 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 8 \
    --checkpoint-dir "$TMP/ck" > "$TMP/w3.log" 2>&1
w=$?
# shellcheck disable=SC2086
"$MESHRUN" -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 12 --resume \
    --checkpoint-dir "$TMP/ck" > "$TMP/r2.log" 2>&1
r2=$?
# shellcheck disable=SC2086
"$MESHRUN" -np 4 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 12 --resume \
    --checkpoint-dir "$TMP/ck" > "$TMP/r4.log" 2>&1
r4=$?
[ $w -eq 0 ] && [ $r2 -eq 1 ] &&
    grep -q "rank-[01]/ckpt-000000008 was written with another \
configuration (.*peer count)" "$TMP/r2.log"
t_ok $? "3 peers' checkpoints resumed by 2: refused, exit 1 (exits $w $r2)"
[ $r4 -eq 1 ] &&
    grep -q "no checkpoint is held with the same digest by all 4 peers" \
        "$TMP/r4.log"
t_ok $? "... resumed by 4: none that every peer holds, exit 1 (exit $r4)"

# shellcheck disable=SC2086
env MESHTRAIN_TEST_FAULT=0:between:6 "$MESHRUN" --elastic -np 3 -- \
    "$MESHTRAIN" --port "$PORT" $TINY --elastic --iters 12 \
    --checkpoint-dir "$TMP/ek" > "$TMP/e3.log" 2>&1
e3=$?
# shellcheck disable=SC2086
"$MESHRUN" -np 3 -- "$MESHTRAIN" --port "$PORT" $TINY --elastic --iters 14 \
    --resume --checkpoint-dir "$TMP/ek" --save "$TMP/resumed.st" \
    > "$TMP/er.log" 2>&1
er=$?
# shellcheck disable=SC2086
"$MESHRUN" -np 3 -- "$MESHTRAIN" --port "$PORT" $TINY --elastic --iters 14 \
    --checkpoint-dir "$TMP/plain" --save "$TMP/plain.st" > "$TMP/p.log" 2>&1
p=$?
[ $e3 -eq 0 ] && [ $er -eq 0 ] && [ $p -eq 0 ] &&
    grep -q "view 1: 2 rank(s) continue; slot(s) 0 left" "$TMP/e3.log" &&
    grep -q "resumed from step 4 " "$TMP/er.log" &&
    cmp -s "$TMP/resumed.st" "$TMP/plain.st"
t_ok $? "--elastic: after a view change, --resume with every slot goes \
back to step 4 and ends bitwise as a run without a break (exits $e3 $er $p)"

make_secret "$TMP/secret"
PEERS=""
for r in 0 1; do
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:3 --rank $r --port "$PORT" \
        --secret-file "$TMP/secret" $TINY --elastic --iters 14 --resume \
        --checkpoint-dir "$TMP/ek" --join-timeout 3 > "$TMP/m$r.log" 2>&1
    PEERS="$PEERS $BG_PID"
done
wait_all 120
[ "$CODES" != "0 0" ] && [ "${CODES#*255}" = "$CODES" ] &&
    grep -q -- "--resume with --elastic needs every slot at the start" \
        "$TMP/m0.log"
t_ok $? "--elastic --resume with slot 2 missing: refused (exits $CODES)"
t_done
