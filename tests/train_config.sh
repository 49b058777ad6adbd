#!/bin/sh
# tests/train_config.sh: peers whose training configurations disagree are
# refused when they join (exit code 2), and the error names the field:
# the model, the per-peer batch, the seed; and two agreeing peers join.
# Both sides fail at once, naming the field: the accepting rank 0 does not
# wait out --join-timeout (30 s here) to say "never joined". Last, a
# configuration that trains a degenerate network (--batch 1 with a 1 x 1
# last stage: its batch norms see one value a channel, and the output does
# not depend on the input; PyTorch refuses it) draws a warning, and the
# same with --batch 2 none.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 6
BASE="$SMALL --data synthetic:512 --num-classes 10 --in-channels 1 \
--iters 1 --no-eval --join-timeout 30"

# pair NAME FIELD ARGS0 -- ARGS1: rank 0 and rank 1 with different flags.
pair() {
    name=$1
    field=$2
    a=$3
    b=$4
    take_ports 2 || { t_ok 1 "free ports"; return; }
    port=$PORT
    make_secret "$TMP/secret"
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 0 --port "$port" \
        --secret-file "$TMP/secret" $BASE $a > "$TMP/$name.0.log" 2>&1
    p0=$BG_PID
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 1 --port "$port" \
        --secret-file "$TMP/secret" $BASE $b > "$TMP/$name.1.log" 2>&1
    p1=$BG_PID
    wait_exit "$p0" 60
    c0=$EXIT_CODE
    after0=$EXIT_AFTER
    wait_exit "$p1" 60
    c1=$EXIT_CODE
    if [ -z "$field" ]; then
        [ "$c0" -eq 0 ] && [ "$c1" -eq 0 ]
        t_ok $? "$name: agreeing peers join and train (exit $c0 $c1)"
        return
    fi
    ok=0
    [ "$c0" -eq 2 ] && [ "$c1" -eq 2 ] || ok=1
    # each side's own fatal error names the field, rank 0 well before
    # the join timeout
    for r in 0 1; do
        grep -q "cannot join the mesh.*configuration differs.*$field=" \
            "$TMP/$name.$r.log" || ok=1
    done
    [ "$after0" -lt 15 ] || ok=1
    t_ok $ok "$name: both refuse at join with exit 2 naming \"$field\" (exit $c0 $c1, rank 0 after ${after0} s)"
    grep -h "cannot join" "$TMP/$name.0.log" "$TMP/$name.1.log" |
        sed 's/^/# /'
    [ $ok -eq 0 ] || { t_show "$TMP/$name.0.log" 5; t_show "$TMP/$name.1.log" 5; }
}

pair model model "--batch 8" "--batch 8 --model resnet34"
pair batch batch "--batch 8" "--batch 16"
pair seed seed "--batch 8 --seed 1" "--batch 8 --seed 2"
pair same "" "--batch 8" "--batch 8"

take_ports 1
for b in 1 2; do
    # shellcheck disable=SC2086
    "$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure $BASE --batch $b \
        --image-size 8 > "$TMP/degenerate.$b.log" 2>&1
    echo $? > "$TMP/degenerate.$b.rc"
done
[ "$(cat "$TMP/degenerate.1.rc")" -eq 0 ] &&
    grep -q "does not depend on the input" "$TMP/degenerate.1.log"
t_ok $? "--batch 1 with a 1 x 1 last stage trains, with a warning"
grep -h "does not depend" "$TMP/degenerate.1.log" | cut -c 1-200 | sed 's/^/# /'
[ "$(cat "$TMP/degenerate.2.rc")" -eq 0 ] &&
    ! grep -q "does not depend on the input" "$TMP/degenerate.2.log"
t_ok $? "--batch 2 there: no such warning"
t_done
