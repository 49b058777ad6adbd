#!/bin/sh
# tests/train_simulate.sh: --simulate-compute, --simulate-scale and
# --profile-layers (train/simulate.h). Two peers with the h200 profile (12.8
# ms of simulated compute per step) run real buckets and all-reduces of
# the scaled gradients, with ring and with the parameter-server baseline;
# the flags that need weights are refused; --profile-layers measures a
# small real model and its CSV drives a simulated run of the same model.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 8
SIM="--simulate-compute h200 --simulate-scale 16 --iters 5 --quiet \
--join-timeout 60"
for a in ring ps; do
    # shellcheck disable=SC2086
    by_hand 2 "$TMP/$a" $SIM --algo $a --metrics "$TMP/$a.jsonl"
    wait_all 120
    [ "$CODES" = "0 0" ] &&
        grep -q "rank 0: simulate: 5 steps, compute stretch" "$TMP/${a}0.log" &&
        grep -q "rank 1: simulate: 5 steps, compute stretch" "$TMP/${a}1.log"
    t_ok $? "--algo $a: 2 simulated peers, 5 steps, both report (exit $CODES)"
    [ "$CODES" = "0 0" ] || t_show "$TMP/${a}0.log"
done
# every step waits at least the profile's 12.8 ms
awk -F'"t_step": ' 'NF > 1 { split($2, v, ","); if (v[1] < 0.0128) bad = 1;
                             n++ } END { exit bad || n != 5 }' "$TMP/ring.jsonl"
t_ok $? "every step takes at least the simulated 12.8 ms"

"$MESHTRAIN" --simulate-compute k80 --save "$TMP/x.st" > "$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "no weights" "$TMP/o"
t_ok $? "--simulate-compute with --save is refused"
"$MESHTRAIN" --algo ps > "$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "ps is a benchmark baseline" "$TMP/o"
t_ok $? "--algo ps without --simulate-compute is refused"
take_ports 1
ONE="-H localhost:1 --rank 0 --insecure --port $PORT"
# shellcheck disable=SC2086
"$MESHTRAIN" $ONE --simulate-compute "$TMP/none.csv" > "$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "none.csv" "$TMP/o"
t_ok $? "a missing profile file is named: $(tail -n 1 "$TMP/o")"

# shellcheck disable=SC2086
"$MESHTRAIN" $ONE $SMALL --data synthetic:256 \
    --batch 8 --iters 3 --no-eval --profile-layers "$TMP/prof.csv" \
    > "$TMP/p.log" 2>&1 &&
    [ "$(grep -c '^layer1\.0\.conv1,' "$TMP/prof.csv")" -eq 1 ] &&
    [ "$(grep -vc '^#' "$TMP/prof.csv")" -eq 42 ]
t_ok $? "--profile-layers: one row per layer of resnet18 (41 + header)"
[ -f "$TMP/prof.csv" ] && sed -n '1,6p' "$TMP/prof.csv" | sed 's/^/# /'
# shellcheck disable=SC2086
"$MESHTRAIN" $ONE --model resnet18 \
    --width 16 --cifar-stem --image-size 14 --num-classes 10 --quiet \
    --simulate-compute "$TMP/prof.csv" --iters 2 > "$TMP/s.log" 2>&1
rc=$?
t_ok $rc "its CSV drives a simulated run of the same model"
[ $rc -eq 0 ] || t_show "$TMP/s.log"
t_done
