#!/bin/sh
# tests/train_simulate.sh: --simulate-compute, --simulate-scale and
# --profile-layers (train/simulate.h). Two peers with the h200 profile (12.8
# ms of simulated compute per step) run real buckets and all-reduces of
# the scaled gradients, with ring and with the parameter-server baseline;
# the flags that need weights are refused; --profile-layers measures a
# small real model and its CSV drives a simulated run of the same model.
# --simulate-gpus G: 8 simulated GPUs as 1 x 8, 2 x 4 and 4 x 2 (processes
# x GPUs, hier among them) reduce to the same bytes on every rank, not
# the untouched slab's; 3 x 3 under auto agree on every rank.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 14
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

# grads_of LOG...: the distinct slab hashes the ranks' simulate lines give
grads_of() {
    sed -n 's/.*: simulate: .* grads \([0-9a-f]*\)$/\1/p' "$@" | sort -u
}
GPUS="--simulate-compute h200 --simulate-scale 64 --iters 3 --quiet \
--join-timeout 60"
# shellcheck disable=SC2086
by_hand 1 "$TMP/g11-" $GPUS
wait_all 60
zero=$(grads_of "$TMP/g11-0.log")
for l in "1 8 ring" "2 4 ring" "4 2 hier" "3 3 auto"; do
    # shellcheck disable=SC2086
    set -- $l
    # shellcheck disable=SC2086
    by_hand "$1" "$TMP/g$1$2-" $GPUS --simulate-gpus "$2" --algo "$3" \
        --metrics "$TMP/g$1$2.jsonl"
    wait_all 60
    h=$(grads_of "$TMP/g$1$2-"*.log)
    [ "$(grads_of "$TMP/g$1$2-"*.log | wc -l)" -eq 1 ] &&
        [ "$(grep -l " $2 GPU(s), grads $h" "$TMP/g$1$2-"*.log |
            wc -l)" -eq "$1" ] && [ -n "$h" ] && [ "$h" != "$zero" ]
    t_ok $? "--simulate-gpus $2 on $1 peer(s), --algo $3: one result on \
every rank ($h; exit $CODES)"
    [ "$1" -eq 3 ] || eight="$eight $h"
done
[ "$(echo $eight | tr ' ' '\n' | sort -u | wc -l)" -eq 1 ]
t_ok $? "8 GPUs as 1 x 8, 2 x 4 and 4 x 2: the same bytes ($eight)"

"$MESHTRAIN" --simulate-compute k80 --save "$TMP/x.st" > "$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "no weights" "$TMP/o"
t_ok $? "--simulate-compute with --save is refused"
"$MESHTRAIN" --simulate-gpus 2 > "$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "simulate-gpus needs --simulate-compute" "$TMP/o"
t_ok $? "--simulate-gpus without --simulate-compute is refused"
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
