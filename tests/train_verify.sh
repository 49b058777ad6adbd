#!/bin/sh
# tests/train_verify.sh: the weight digest check. 3 peers where rank 1's
# weights differ by one ulp in one element (the MESHTRAIN_TEST_PERTURB
# test aid) must all stop before step 1 with exit code 4, naming rank 1;
# without the aid the same job passes.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 2
COMMON="$SMALL --data synthetic:512 --num-classes 10 --in-channels 1 \
--batch 8 --iters 2 --no-eval --join-timeout 60"
# shellcheck disable=SC2086
MESHTRAIN_TEST_PERTURB=1 by_hand 3 "$TMP/bad" $COMMON
wait_all 120
ok=0
[ "$CODES" = "4 4 4" ] || ok=1
grep -q "rank(s) 1 differ from rank 0" "$TMP/bad0.log" || ok=1
t_ok $ok "one ulp on rank 1: every peer exits 4 naming rank 1 ($CODES)"
grep -h "weights differ" "$TMP/bad0.log" | sed 's/^/# /'
[ $ok -eq 0 ] || t_show "$TMP/bad0.log"
# shellcheck disable=SC2086
by_hand 3 "$TMP/good" $COMMON
wait_all 120
[ "$CODES" = "0 0 0" ]
t_ok $? "the same job without the perturbation passes ($CODES)"
t_done
