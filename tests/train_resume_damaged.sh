#!/bin/sh
# tests/train_resume_damaged.sh: --resume never silently starts from
# step 0. 2 peers checkpoint at step 2; then one byte of every rank's
# model.safetensors is flipped. --resume must fail (exit 1 on both ranks,
# each naming its damaged file and why) instead of training from scratch
# (it used to warn, start from step 0 and exit 0); --resume=if-any may
# start from step 0, and says so. With no checkpoint at all, --resume is
# an error too and --resume=if-any starts from step 0. A FIFO or a link to
# /dev/zero in place of a checkpoint's file (which would block the scan's
# open, or never end) makes that checkpoint damaged, not the job hang.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 6
BASE="$SMALL --data synthetic:256 --num-classes 10 --in-channels 1 \
--batch 8 --no-eval --join-timeout 20 --checkpoint-every 2"

# shellcheck disable=SC2086
by_hand 2 "$TMP/a" $BASE --iters 2 --checkpoint-dir "$TMP/ck"
wait_all 60
ok=0
[ "$CODES" = "0 0" ] || ok=1
for r in 0 1; do
    f=$TMP/ck/rank-$r/ckpt-000000002/model.safetensors
    [ -f "$f" ] || { ok=1; continue; }
    # flip every bit of the byte at offset 4000 (inside the tensor data)
    /usr/bin/python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4000); b = f.read(1); f.seek(4000); f.write(bytes([b[0] ^ 0xff]))
' "$f" || ok=1
done
t_ok $ok "2 peers checkpoint at step 2, one byte of each model.safetensors \
flipped (exit codes $CODES)"

# shellcheck disable=SC2086
by_hand 2 "$TMP/b" $BASE --iters 4 --checkpoint-dir "$TMP/ck" --resume
wait_all 60
ok=0
[ "$CODES" = "1 1" ] || ok=1
for r in 0 1; do
    grep -q "^meshtrain: rank $r: --resume: .*damaged here: .*rank-$r/ckpt-000000002/model.safetensors" \
        "$TMP/b$r.log" || ok=1
done
grep -q "starting from step 0" "$TMP/b0.log" && ok=1
t_ok $ok "--resume with every checkpoint damaged: exit 1 on both ranks, \
each naming its file (exit codes $CODES)"
grep -h "^meshtrain:" "$TMP/b0.log" "$TMP/b1.log" | sed 's/^/# /'
[ $ok -eq 0 ] || { t_show "$TMP/b0.log" 8; t_show "$TMP/b1.log" 8; }

# shellcheck disable=SC2086
by_hand 2 "$TMP/c" $BASE --iters 2 --checkpoint-dir "$TMP/ck" \
    --resume=if-any
wait_all 60
ok=0
[ "$CODES" = "0 0" ] || ok=1
grep -q "if-any.*starting from step 0" "$TMP/c0.log" || ok=1
t_ok $ok "--resume=if-any with every checkpoint damaged: starts from step 0 \
with a warning (exit codes $CODES)"
[ $ok -eq 0 ] || t_show "$TMP/c0.log" 8

# shellcheck disable=SC2086
by_hand 2 "$TMP/d" $BASE --iters 2 --checkpoint-dir "$TMP/empty" --resume
wait_all 60
ok=0
[ "$CODES" = "1 1" ] || ok=1
grep -q "^meshtrain: rank 0: --resume: no peer has a usable checkpoint" \
    "$TMP/d0.log" || ok=1
t_ok $ok "--resume with no checkpoint at all: exit 1 (exit codes $CODES)"
[ $ok -eq 0 ] || t_show "$TMP/d0.log" 8

# shellcheck disable=SC2086
by_hand 2 "$TMP/e" $BASE --iters 2 --checkpoint-dir "$TMP/empty2" \
    --resume=if-any
wait_all 60
[ "$CODES" = "0 0" ]
t_ok $? "--resume=if-any with no checkpoint at all: starts from step 0 \
(exit codes $CODES)"

# shellcheck disable=SC2086
by_hand 2 "$TMP/f" $BASE --iters 4 --checkpoint-dir "$TMP/ck3"
wait_all 60
ok=0
[ "$CODES" = "0 0" ] || ok=1
c0=$TMP/ck3/rank-0/ckpt-000000004
c1=$TMP/ck3/rank-1/ckpt-000000004
rm -f "$c0/momentum" "$c1/trainer"
mkfifo "$c0/momentum" && ln -s /dev/zero "$c1/trainer" || ok=1
# shellcheck disable=SC2086
by_hand 2 "$TMP/g" $BASE --iters 6 --checkpoint-dir "$TMP/ck3" --resume
wait_all 120
[ "$CODES" = "0 0" ] || ok=1
grep -q "resumed from step 2 " "$TMP/g0.log" &&
    grep -q "ckpt-000000004/momentum is a FIFO, not a regular file" \
        "$TMP/g0.log" &&
    grep -q "ckpt-000000004/trainer is a character device, not a regular" \
        "$TMP/g1.log" || ok=1
t_ok $ok "a FIFO and a link to /dev/zero in checkpoints of step 4: skipped \
as damaged, resumed from step 2 (exit codes $CODES)"
[ $ok -eq 0 ] || { t_show "$TMP/g0.log" 8; t_show "$TMP/g1.log" 8; }
t_done
