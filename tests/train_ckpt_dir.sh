#!/bin/sh
# tests/train_ckpt_dir.sh: checkpoint directory errors are configuration
# errors of the rank that has them. --checkpoint-every without
# --checkpoint-dir is refused (exit 1) instead of writing nothing; and
# when one rank of two cannot use its checkpoint directory, that rank
# exits 1 naming the directory while its peer exits 3 naming that rank
# as the culprit (both used to exit 3).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 2
BASE="$SMALL --data synthetic:256 --num-classes 10 --in-channels 1 \
--batch 8 --iters 4 --no-eval --join-timeout 20"

take_ports 1 || exit 99
# shellcheck disable=SC2086
"$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure $BASE \
    --checkpoint-every 2 > "$TMP/nodir.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q -- "--checkpoint-every.*--checkpoint-dir" \
    "$TMP/nodir.log"
t_ok $? "--checkpoint-every without --checkpoint-dir: exit 1 (exit $rc)"
grep meshtrain: "$TMP/nodir.log" | head -n 1 | sed 's/^/# /'

# Rank 0's DIR/rank-0 is a file: rank 0's own configuration is wrong.
mkdir "$TMP/ck"
: > "$TMP/ck/rank-0"
# shellcheck disable=SC2086
by_hand 2 "$TMP/r" $BASE --checkpoint-every 2 --checkpoint-dir "$TMP/ck"
wait_all 60
ok=0
[ "$CODES" = "1 3" ] || ok=1
grep -q "meshtrain: rank 0: .*ck/rank-0" "$TMP/r0.log" || ok=1
grep -q "meshtrain: rank 1: .*rank 0 (.*) aborted the job" "$TMP/r1.log" ||
    ok=1
t_ok $ok "bad checkpoint directory on rank 0: rank 0 exits 1, rank 1 exits \
3 naming rank 0 (exit codes $CODES)"
grep -h "^meshtrain:" "$TMP/r0.log" "$TMP/r1.log" | sed 's/^/# /'
[ $ok -eq 0 ] || { t_show "$TMP/r0.log" 5; t_show "$TMP/r1.log" 5; }
t_done
