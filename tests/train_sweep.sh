#!/bin/sh
# tests/train_sweep.sh: short regressions of what the sweeps
# (scripts/train_sweep.sh, scripts/elastic_sweep.sh) found.
# - meshrun --elastic --restarts: a rank started again that has not joined
#   when the job's last member finishes has no job left to join; meshrun
#   stopped it only 60 s (LATE_S) after the first rank finished, so the
#   job's end waited a minute for nothing (the sweep: a restart near the
#   end of a 3-rank job). Here slot 1 is killed at step 20 and its restart
#   stops itself in its catch-up (MESHTRAIN_TEST_FAULT 1:catchup:0:stop),
#   so it is still waiting when the others finish: meshrun must say that
#   it has no job left to join and exit 0 with 2 of 3 ranks finished.
# - --resume of a checkpoint written with another configuration was
#   refused naming only the kinds of field that might differ ("model,
#   data, batch, seed, optimizer or peer count"), also where it was
#   --accumulate or --precision; checkpoints now hold the configuration's
#   text and the refusal names what differs. Here 2 peers write one and
#   resume it with --accumulate 2: exit 1, naming accumulate (and the
#   steps per epoch it changes).
# - meshrun --elastic --min-peers above the slot count ran the whole job
#   and failed it at the end ("only 2 of 2 rank(s) finished, fewer than
#   --min-peers 3"); it is refused before any rank starts.
# - A hostfile with one machine under two names and the same port
#   (localhost and 127.0.0.1, or Horovod's host:N lines on 127.0.0.1 and
#   127.0.0.2, both from the default port) failed the second rank's bind
#   with only "Address already in use"; it now names the rank that has
#   the same port under the other name.
# - meshrun --restarts starts a dead rank again with the job's own flags;
#   with --resume among them (a job meant to survive its own restarts)
#   the new process, a joiner, refused itself ("--resume with --elastic
#   needs every slot at the start", exit 1) after the members had
#   admitted it, and the job stalled 5 s on the join that never came. A
#   joiner takes the members' state; --resume stays refused where view 0
#   did not form.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 8
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:400 --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout 10 --join-timeout 60"

take_ports 3 || t_skip_all "no free ports"
# slot 1's first process never reaches a catch-up (it is a member with
# no joiner); the one started again stops in its own
# shellcheck disable=SC2086
bg env MESHTRAIN_TEST_FAULT=1:catchup:0:stop "$MESHRUN" --restarts 1 \
    -H localhost:3 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 3000 \
    --metrics "$TMP/late.metrics" > "$TMP/late.log" 2>&1
RUN=$BG_PID
at_step late 20
pid=$(rank_pid "$RUN" 1) && kill -KILL "$pid"
t_ok $? "slot 1 killed at step 20 (pid ${pid:-none})"
wait_exit "$RUN" 300
[ "$EXIT_CODE" -eq 0 ] &&
    grep -q "meshrun: rank 1 (localhost), started again, has no job left to \
join; stopping it" "$TMP/late.log" &&
    grep -q "meshrun: 2 of 3 rank(s) finished" "$TMP/late.log"
t_ok $? "the restart waiting to join is stopped when the job's last member \
finishes; meshrun exits 0 ($EXIT_CODE)"
[ "$EXIT_CODE" -eq 0 ] || grep "^meshrun" "$TMP/late.log" | sed "s/^/#   /"

take_ports 2
# shellcheck disable=SC2086
"$MESHRUN" -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 4 \
    --checkpoint-every 4 --checkpoint-dir "$TMP/ck" > "$TMP/w.log" 2>&1
w=$?
# shellcheck disable=SC2086
"$MESHRUN" -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 8 \
    --checkpoint-dir "$TMP/ck" --resume --accumulate 2 > "$TMP/r.log" 2>&1
r=$?
[ $w -eq 0 ] && [ $r -eq 1 ] &&
    grep -q "rank-0/ckpt-000000004 was written with another configuration \
(.*): accumulate=1 there, accumulate=2 here; steps_per_epoch=" "$TMP/r.log"
t_ok $? "--resume with --accumulate 2 of a checkpoint without: refused, \
naming accumulate (exits $w $r)"
[ $r -eq 1 ] || t_show "$TMP/r.log" 5
# shellcheck disable=SC2086
"$MESHRUN" -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 8 \
    --checkpoint-dir "$TMP/ck" --resume --precision bf16-amp \
    > "$TMP/rp.log" 2>&1
r=$?
[ $r -eq 1 ] && grep -q "precision=0 (default) there, precision=3 \
(bf16-amp) here" "$TMP/rp.log"
t_ok $? "--resume with --precision bf16-amp of a checkpoint without: \
refused, naming the precisions (exit $r)"
[ $r -eq 1 ] || t_show "$TMP/rp.log" 5
# shellcheck disable=SC2086
"$MESHRUN" -np 2 -- "$MESHTRAIN" --port "$PORT" $TINY --iters 3 \
    --checkpoint-dir "$TMP/ck" --resume > "$TMP/re.log" 2>&1
r=$?
[ $r -eq 0 ] && grep -q "the checkpoint holds step 4, at or past this \
run's last step (3, from --iters or --epochs): no step is trained" \
    "$TMP/re.log"
t_ok $? "--resume of step 4 with --iters 3: a warning that no step is \
trained (exit $r)"
[ $r -eq 0 ] || t_show "$TMP/re.log" 5

# shellcheck disable=SC2086
"$MESHRUN" -np 2 --elastic --min-peers 3 -- "$MESHTRAIN" --port "$PORT" \
    $TINY --iters 4 --save "$TMP/mp.st" > "$TMP/mp.log" 2>&1
m=$?
[ $m -eq 1 ] && [ ! -e "$TMP/mp.st" ] &&
    grep -q "^meshrun: --min-peers 3 but the hosts have 2 slots" "$TMP/mp.log"
t_ok $? "meshrun --elastic --min-peers 3 on 2 slots: refused before the run \
(exit $m)"

take_ports 1
printf 'localhost slots=1 port=%s\n127.0.0.1 slots=1 port=%s\n' "$PORT" \
    "$PORT" > "$TMP/hosts"
"$MESHRUN" --hostfile "$TMP/hosts" -- "$MESHBENCH" --join-timeout 10 -n 1 \
    > "$TMP/dup.log" 2>&1
d=$?
[ $d -eq 2 ] && grep -q "bind port $PORT: Address already in use; rank [01] \
(\(localhost\|127.0.0.1\):$PORT) has this port too" "$TMP/dup.log"
t_ok $? "one machine as localhost and 127.0.0.1 on one port: the bind's \
error names the other rank (exit $d)"
[ $d -eq 2 ] || t_show "$TMP/dup.log" 5

take_ports 3
# shellcheck disable=SC2086
env MESHTRAIN_TEST_FAULT=1:between:5 MESHTRAIN_TEST_JOIN_AT=55 "$MESHRUN" \
    --restarts 1 -H localhost:3 -- "$MESHTRAIN" --port "$PORT" $TINY \
    --iters 60 --resume=if-any --checkpoint-every 20 \
    --checkpoint-dir "$TMP/rk" > "$TMP/rj.log" 2>&1
j=$?
[ $j -eq 0 ] && grep -q "meshrun: 3 of 3 rank(s) finished" "$TMP/rj.log" &&
    grep -q "this peer joins a running job and takes its state" "$TMP/rj.log"
t_ok $? "--resume=if-any under meshrun --restarts: the restarted rank joins \
(exit $j)"
[ $j -eq 0 ] || grep "^meshrun\|resume" "$TMP/rj.log" | sed "s/^/#   /"
t_done
