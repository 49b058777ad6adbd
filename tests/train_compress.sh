#!/bin/sh
# tests/train_compress.sh: --compress fp16 and bf16 put the gradients on
# the wire as 16-bit values. 2 peers train 4 steps each way: the replicas
# stay identical (the digest check passes), and the weights stay close to
# the float32 run's without being equal to them (the compression did
# happen). A 16-bit gradient differs by up to 2^-11 (fp16) or 2^-8 (bf16)
# relative per element, and the network amplifies that over the steps
# (see train_equiv.sh); measured relative distances after 4 steps: 3.5e-3
# (fp16), 6e-3 (bf16). Tolerance 3e-2; a wrong scale or a bucket not
# converted back is off by 1e-1 or more.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 5
COMMON="$SMALL --data fashion-mnist --batch 16 --lr 0.05 --iters 4 \
--no-eval --verify-every 1 --algo ring --join-timeout 60"
for c in none fp16 bf16; do
    # shellcheck disable=SC2086
    by_hand 2 "$TMP/$c" $COMMON --compress $c --save "$TMP/$c.st"
    wait_all 300
    [ "$CODES" = "0 0" ]
    t_ok $? "--compress $c: 2 peers, digests agree every step (exit $CODES)"
    [ "$CODES" = "0 0" ] || t_show "$TMP/${c}0.log"
done
for c in fp16 bf16; do
    /usr/bin/python3 "$top_srcdir/tests/train_compare.py" weights \
        "$TMP/none.st" "$TMP/$c.st" 3e-2 > "$TMP/cmp" &&
        ! cmp -s "$TMP/none.st" "$TMP/$c.st"
    t_ok $? "--compress $c: weights within 3e-2 of float32's, not equal"
    sed 's/^/# /; s/^# #/#/' "$TMP/cmp"
done
t_done
