#!/bin/sh
# tests/train_ckpt_full.sh: a checkpoint write that fails in the middle of
# a run (the disk fills up) loses nothing. Rank 0's checkpoint directory
# is an 8 MiB tmpfs: its step-2 checkpoint (5.4 MiB) fits, the step-4 one
# does not. Rank 0 must exit 1 naming the write and ENOSPC, rank 1 exit 3
# naming rank 0; rank 0's step-2 checkpoint must stay complete with no
# temporary left beside it; and once the disk has room, --resume must
# continue from step 2 to weights bitwise equal to an uninterrupted run's.
# Needs root (mount); a TAP skip otherwise.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

[ "$(id -u)" -eq 0 ] || t_skip_all "needs root to mount a small tmpfs"
mkdir "$TMP/full" "$TMP/ok" "$TMP/ref"
mount -t tmpfs -o size=8m meshtrain-test "$TMP/full" 2>/dev/null ||
    t_skip_all "cannot mount a tmpfs here"
cleanup_full() { umount "$TMP/full" 2>/dev/null; }
trap 'cleanup_full; t_cleanup' EXIT
t_plan 5
BASE="$SMALL --data synthetic:256 --num-classes 10 --in-channels 1 \
--batch 8 --iters 8 --no-eval --join-timeout 30 --checkpoint-every 2"

# The reference: the same job, never interrupted.
# shellcheck disable=SC2086
by_hand 2 "$TMP/ref" $BASE --checkpoint-dir "$TMP/ref" --keep 4 \
    --save "$TMP/ref.st"
wait_all 120
[ "$CODES" = "0 0" ] || { t_show "$TMP/ref0.log"; t_show "$TMP/ref1.log"; }

# Rank 0 on the small disk, rank 1 on a roomy one: two hosts' worth of
# directories, one per rank, as by hand.
take_ports 2 || exit 99
make_secret "$TMP/secret"
# shellcheck disable=SC2086
bg "$MESHTRAIN" -H localhost:2 --rank 0 --port "$PORT" \
    --secret-file "$TMP/secret" $BASE --checkpoint-dir "$TMP/full" \
    > "$TMP/a0.log" 2>&1
p0=$BG_PID
# shellcheck disable=SC2086
bg "$MESHTRAIN" -H localhost:2 --rank 1 --port "$PORT" \
    --secret-file "$TMP/secret" $BASE --checkpoint-dir "$TMP/ok" \
    > "$TMP/a1.log" 2>&1
PEERS="$p0 $BG_PID"
wait_all 120
ok=0
[ "$CODES" = "1 3" ] || ok=1
grep -q "rank-0/.*No space left on device" "$TMP/a0.log" || ok=1
grep -q "blaming rank 0.*No space left on device" "$TMP/a1.log" || ok=1
t_ok $ok "disk full at the step-4 checkpoint: rank 0 exits 1 naming the \
write, rank 1 exits 3 naming rank 0 (exits $CODES)"
[ $ok -eq 0 ] || { t_show "$TMP/a0.log"; t_show "$TMP/a1.log"; }
grep "error:" "$TMP/a0.log" | head -n 1 | cut -c1-240 | sed 's/^/# /'

left=$(cd "$TMP/full/rank-0" 2>/dev/null && ls -A | tr '\n' ' ')
[ "$left" = "ckpt-000000002 " ]
t_ok $? "rank 0 keeps its step-2 checkpoint and no temporary (has: $left)"
cmp -s "$TMP/full/rank-0/ckpt-000000002/model.safetensors" \
    "$TMP/ref/rank-0/ckpt-000000002/model.safetensors"
t_ok $? "rank 0's step-2 checkpoint equals the uninterrupted run's"

# Room again (a remount keeps the files); resume both ranks.
mount -o remount,size=64m "$TMP/full"
take_ports 2 || exit 99
# shellcheck disable=SC2086
bg "$MESHTRAIN" -H localhost:2 --rank 0 --port "$PORT" \
    --secret-file "$TMP/secret" $BASE --checkpoint-dir "$TMP/full" \
    --resume --save "$TMP/b.st" > "$TMP/b0.log" 2>&1
p0=$BG_PID
# shellcheck disable=SC2086
bg "$MESHTRAIN" -H localhost:2 --rank 1 --port "$PORT" \
    --secret-file "$TMP/secret" $BASE --checkpoint-dir "$TMP/ok" \
    --resume > "$TMP/b1.log" 2>&1
PEERS="$p0 $BG_PID"
wait_all 120
ok=0
[ "$CODES" = "0 0" ] || ok=1
grep -qi "resum.*step 2\b\|resum.*000000002" "$TMP/b0.log" || ok=1
t_ok $ok "--resume continues from step 2, the newest checkpoint both hold \
(exits $CODES)"
[ $ok -eq 0 ] || { t_show "$TMP/b0.log"; t_show "$TMP/b1.log"; }
cmp -s "$TMP/b.st" "$TMP/ref.st"
t_ok $? "the resumed run's final weights equal the uninterrupted run's, bitwise"
t_done
