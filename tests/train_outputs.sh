#!/bin/sh
# tests/train_outputs.sh: every output path is checked before step 1, not
# when it is written at the end of the run (which lost the result): --save,
# --metrics, --timeline and --profile-layers (rank 0) in a directory that
# does not exist or on a read-only file system, and a --checkpoint-dir
# that cannot be created (any rank). The job runs for 100000 steps: only
# a check before step 1 ends it in time. The rank with the bad path exits
# 1 naming the flag and the path; its peer exits 3 blaming it.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 6
BASE="$SMALL --data synthetic:256 --num-classes 10 --in-channels 1 \
--batch 8 --iters 100000 --no-eval --join-timeout 20"
NX=$TMP/nonexistent

take_ports 1 || exit 99
# one NAME FLAG PATH: a world of one with FLAG PATH must exit 1 at once.
one() {
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure $BASE \
        "$2" "$3" > "$TMP/$1.log" 2>&1
    wait_exit "$BG_PID" 30
    ok=0
    [ "$EXIT_CODE" -eq 1 ] || ok=1
    grep -qE -- "^meshtrain: (rank 0: )?$2 $3" "$TMP/$1.log" || ok=1
    t_ok $ok "$2 $3: exit 1 before step 1, naming it (exit $EXIT_CODE)"
    grep "^meshtrain:" "$TMP/$1.log" | head -n 1 | sed 's/^/# /'
    [ $ok -eq 0 ] || t_show "$TMP/$1.log" 5
}
one metrics --metrics "$NX/m.jsonl"
one timeline --timeline "$NX/t.json"
one profile --profile-layers "$NX/p.csv"
mkdir "$TMP/isdir"
one isdir --save "$TMP/isdir"

# A read-only file system: a tmpfs mounted read-only in a private mount
# namespace (root only).
mkdir "$TMP/ro"
if unshare -m sh -c "mount -t tmpfs -o ro none '$TMP/ro'" 2>/dev/null; then
    # shellcheck disable=SC2086
    unshare -m sh -c "mount -t tmpfs -o ro none '$TMP/ro' &&
        exec timeout 30 '$MESHTRAIN' -H localhost:1 --port $PORT --insecure \
        $BASE --save '$TMP/ro/w.st'" > "$TMP/ro.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "^meshtrain: rank 0: --save $TMP/ro/w.st" \
        "$TMP/ro.log" && grep -q "Read-only" "$TMP/ro.log"
    t_ok $? "--save on a read-only file system: exit 1 before step 1 (exit $rc)"
    grep "^meshtrain:" "$TMP/ro.log" | head -n 1 | sed 's/^/# /'
else
    t_skip "cannot mount a read-only tmpfs here (needs root and unshare)"
fi

# two NAME ARGS0 -- ARGS1 EXPECTED-CODES BAD-RANK FLAG
two() {
    take_ports 2 || { t_ok 1 "free ports"; return; }
    make_secret "$TMP/secret"
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 0 --port "$PORT" \
        --secret-file "$TMP/secret" $BASE $2 > "$TMP/$1.0.log" 2>&1
    PEERS=$BG_PID
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 1 --port "$PORT" \
        --secret-file "$TMP/secret" $BASE $3 > "$TMP/$1.1.log" 2>&1
    PEERS="$PEERS $BG_PID"
    wait_all 30
    ok=0
    [ "$CODES" = "$4" ] || ok=1
    grep -q -- "^meshtrain: rank $5: $6" "$TMP/$1.$5.log" || ok=1
    grep -q "rank $5 (.*) aborted the job" "$TMP/$1.$((1 - $5)).log" || ok=1
    t_ok $ok "$6 bad on rank $5 of 2: exit codes $4 before step 1, the \
peer blames rank $5 (exit codes $CODES)"
    grep -h "^meshtrain:" "$TMP/$1.0.log" "$TMP/$1.1.log" | sed 's/^/# /'
    [ $ok -eq 0 ] || { t_show "$TMP/$1.0.log" 5; t_show "$TMP/$1.1.log" 5; }
}
# (--save bad on rank 0 of 2 is now refused while parsing, before the join;
# its peer then fails the join: train_badinput.sh covers the refusal)
two ckdir "--checkpoint-every 50000 --checkpoint-dir $TMP/ck" \
    "--checkpoint-every 50000 --checkpoint-dir $NX/ck" "3 1" 1 \
    "--checkpoint-dir $NX/ck"
t_done
