#!/bin/sh
# tests/train_ckpt_dir.sh: checkpoint directory errors are configuration
# errors: --checkpoint-every without --checkpoint-dir is refused (exit 1)
# instead of writing nothing.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 1
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

t_done
