#!/bin/sh
# scripts/train_sweep.sh [CASES] [FIRST]: meshtrain on several ranks per
# host against one process with the same global batch (--accumulate
# peers x K), over layouts (slots per host, e.g. 2+3+1), every --algo,
# bucket sizes, --accumulate, fp32 and bf16-amp, --compress, odd batches
# and sample counts not divisible by the global batch, two epochs of one
# step each (so a tail is dropped twice; a third step at batch 1, where
# layer4's batch norm sees 4 values a channel, parts a correct run from
# the one process by 3e-4 in fp32: chaos, as in tests/train_equiv.sh).
# Per case: exit 0 everywhere (every step's weight digest agrees across
# ranks: --verify-every 1); the weights and every loss within 1e-4 of the
# one process's (bf16-amp 1e-3: a weight 1 ulp apart can round to another
# bfloat16, and 2x3 ranks x --accumulate 2 against one process's 12
# parted by 3.7e-4 after 2 steps, 3e-9 after 1; --compress fp16 or bf16
# 3e-3, fp32 at batch 3 or more); --compress topk or threshold: the
# weights bitwise those of as many ranks on one host by ring (pairs
# summed in rank order);
# and --eval-only of the trained weights on the layout and on one
# process: the same sample count and accuracies. (The trained runs' own
# evaluations differ: N peers average N running statistics each updated
# once, one process updates one N times.) The hosts are 127.0.0.x: one
# machine, so shared memory joins every rank and the collectives see one
# host; SWEEP_NETNS=1 (root): network namespaces (scripts/netns.sh,
# 10.77.0.x), TCP between them and shared memory inside each, and hosts of
# one size run the hierarchical forms. SWEEP_ALGOS, SWEEP_COMPS and
# SWEEP_LAYOUTS (up to 4 hosts) replace the lists; SWEEP_EXTRA adds
# meshtrain flags; SWEEP_KEEP=DIR keeps the failed cases' logs. Not part
# of make check (minutes); one line per case and a summary.
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
. "$top_srcdir/tests/train_lib.sh"

CASES=${1:-60}
FIRST=${2:-0}
LAYOUTS=${SWEEP_LAYOUTS:-"4 2+2 2+2+2 1+1+1 3 1+1 3+1 1+2 2+3+1 1+3"}
ALGOS=${SWEEP_ALGOS:-"ring tree direct rd rhd hier htree hrd local auto"}
BATCHES="1 3 2 5"
ACCS="1 2 3"
BUCKETS="0.01 25 0.002 0.1"
PRECS="fp32 bf16-amp"
COMPS=${SWEEP_COMPS:-"none none fp16 none topk:0.1 none bf16 threshold:0.01"}
TINY="--model resnet18 --width 8 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --num-classes 10 --in-channels 1 --lr 0.05 \
--verify-every 1 --join-timeout 60 ${SWEEP_EXTRA:-}"

sweep_hosts ts

fails=0
n=0
i=$FIRST
while [ $n -lt "$CASES" ]; do
    lay=$(pick $i $LAYOUTS)
    algo=$(pick $((i / 6)) $ALGOS)
    b=$(pick $((i / 7)) $BATCHES)
    k=$(pick $((i / 3)) $ACCS)
    mb=$(pick $((i / 5)) $BUCKETS)
    prec=$(pick $((i / 11)) $PRECS)
    comp=$(pick $((i / 13)) $COMPS)
    # 16-bit gradients at batch 1 part from the one process by 1e-2 in
    # the second step (bf16: 8e-5 after the first, 7e-3 after the second;
    # with bf16-amp 6e-6, then 1e-2): fp32 and batch 3 or more with them
    case $comp in fp16 | bf16) prec=fp32 b=$((b < 3 ? 3 : b)) ;; esac
    np=$(echo "$lay" | tr + '\n' | awk '{ n += $1 } END { print n }')
    g=$((b * np * k))
    samples=$((g + (i * 7) % g))
    take_ports 16 || { echo "no ports"; exit 1; }
    : > "$TMP/hosts"
    h=1
    at=$PORT
    for per in $(echo "$lay" | tr + ' '); do
        echo "$HOSTNET.$h slots=$per port=$at" >> "$TMP/hosts"
        h=$((h + 1))
        at=$((at + per))
    done
    flags="$TINY --data synthetic:$samples --batch $b --epochs 2 \
--precision $prec"
    name="$i: $lay $algo b=$b acc=$k bucket=$mb $prec n=$samples"
    [ "$comp" = none ] || name="$name $comp"
    rm -f "$TMP/p.st" "$TMP/p.jsonl"
    # shellcheck disable=SC2086
    timeout 300 "$MESHRUN" $LAUNCH --hostfile "$TMP/hosts" -- \
        "$MESHTRAIN" $flags --accumulate $k --bucket-mb $mb --algo $algo \
        --compress $comp --save "$TMP/p.st" --metrics "$TMP/p.jsonl" \
        > "$TMP/p.log" 2>&1
    rc=$?
    ref=$TMP/ref-$b-$((np * k))-$prec-$samples
    tol=1e-4
    [ "$prec" = fp32 ] || tol=1e-3
    case $comp in
    fp16 | bf16) tol=3e-3 ;; # 16-bit gradients on the wire
    topk* | threshold*)
        # sparse pairs (of each bucket) summed in rank order: the same
        # weights for any layout and algorithm of as many ranks (one
        # host, ring); the loss is all-reduced, by the algorithm's order
        ref=$TMP/sparse-$comp-$b-$np-$k-$prec-$samples-$mb
        tol=0
        # shellcheck disable=SC2086
        [ -f "$ref.st" ] || timeout 300 "$MESHRUN" -np $np -- "$MESHTRAIN" \
            --port "$PORT" $flags --accumulate $k --algo ring --bucket-mb $mb \
            --compress $comp --save "$ref.st" --metrics "$ref.jsonl" \
            > "$ref.log" 2>&1 || { echo "REF FAIL $name"; tail -3 "$ref.log"; }
        ;;
    esac
    if [ ! -f "$ref.st" ]; then
        # shellcheck disable=SC2086
        timeout 300 "$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure \
            $flags --accumulate $((np * k)) --save "$ref.st" \
            --metrics "$ref.jsonl" > "$ref.log" 2>&1 ||
            { echo "REF FAIL $name"; tail -3 "$ref.log"; }
    fi
    ltol=$tol
    [ "$tol" = 0 ] && ltol=1e-6
    why=""
    if [ $rc -ne 0 ]; then
        why="exit $rc: $(grep -E 'error|fail' "$TMP/p.log" | head -2 |
                         cut -c 1-200)"
    else
        w=$(/usr/bin/python3 "$top_srcdir/tests/train_compare.py" weights \
            "$TMP/p.st" "$ref.st" $tol) || why="weights: $w"
        l=$(/usr/bin/python3 "$top_srcdir/tests/train_compare.py" loss \
            "$TMP/p.jsonl" "$ref.jsonl" $ltol) ||
            why="$why loss: $(echo "$l" | tail -1)"
        # the evaluation of the same weights, sharded over the layout and
        # on one process: the same samples, counts and accuracies
        # shellcheck disable=SC2086
        timeout 300 "$MESHRUN" $LAUNCH --hostfile "$TMP/hosts" -- \
            "$MESHTRAIN" $flags --algo $algo --init "$TMP/p.st" --eval-only \
            > "$TMP/e.log" 2>&1
        # shellcheck disable=SC2086
        timeout 300 "$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure \
            $flags --init "$TMP/p.st" --eval-only > "$TMP/e1.log" 2>&1
        a1=$(grep -o 'accuracy of [0-9]* samples.*' "$TMP/e.log")
        a2=$(grep -o 'accuracy of [0-9]* samples.*' "$TMP/e1.log")
        [ -n "$a1" ] && [ "${a1%% over*}${a1#*peer(s)}" = \
            "${a2%% over*}${a2#*peer(s)}" ] || why="$why eval: $a1 vs $a2"
    fi
    if [ -n "$why" ]; then
        echo "FAIL $name: $why"
        fails=$((fails + 1))
        [ -n "$SWEEP_KEEP" ] && cp "$TMP/p.log" "$SWEEP_KEEP/case$i.log"
    else
        echo "ok   $name: $(echo "$w" | sed 's/.*= \([^ ]*\) over.*/\1/')"
    fi
    n=$((n + 1))
    i=$((i + 1))
done
echo "# $n cases, $fails failed"
[ $fails -eq 0 ]
