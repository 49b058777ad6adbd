#!/bin/sh
# tests/train_bf16.sh: meshtrain --precision bf16-amp on the cpu backend.
#
# 1. With oneDNN capped to AVX2 (DNNL_MAX_CPU_ISA), which has no bfloat16
#    kernels, bf16-amp stops at start with exit 1 and a message that says
#    why and names MESHTRAIN_CPU_BF16=emulate; with that set, it trains.
# 2. Convergence: the small model of the other scenario tests (ResNet-18 of
#    width 16, 14 x 14 inputs) for 1 epoch of Fashion-MNIST (cosine
#    schedule), one peer, in fp32 and in bf16-amp, seeds 1 and 2: every
#    bf16-amp run reaches >= 87 % top-1, and the mean of its two runs lies
#    within 0.8 points of fp32's. Measured: fp32 88.73 / 88.32, bf16-amp
#    88.26 / 88.64 (means 88.53 and 88.45). At this size the seed alone
#    moves fp32 by 0.4 points, so the issue's 0.3-point goal is measured
#    at the demo's size by hand: bench/bf16_converge.sh (about 5
#    CPU-minutes; seed 1: fp32 90.72 %, bf16-amp 90.57 %, -0.15 points).
#    Here: four runs of about 40 CPU-seconds, two at a time (under 90 s
#    alone on 2 cores).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

[ -r "$FMNIST/train-images-idx3-ubyte.gz" ] ||
    t_skip_all "no Fashion-MNIST in $FMNIST (dataset-fashion-mnist)"
t_plan 6

# 1. the refusal and the emulation, on a CPU oneDNN sees as AVX2
take_ports 1 || exit 99
# shellcheck disable=SC2086
DNNL_MAX_CPU_ISA=AVX2 "$MESHTRAIN" -H localhost:1 --insecure --port "$PORT" \
    ${SMALL% --quiet} --data synthetic:64 --iters 2 --no-eval \
    > "$TMP/f32.log" 2>&1
if ! grep -q "activations nChw8c\|activations NCHW" "$TMP/f32.log"; then
    t_skip "oneDNN did not take the AVX2 cap (DNNL_MAX_CPU_ISA)"
    t_skip "oneDNN did not take the AVX2 cap (DNNL_MAX_CPU_ISA)"
else
    # shellcheck disable=SC2086
    DNNL_MAX_CPU_ISA=AVX2 "$MESHTRAIN" -H localhost:1 --insecure \
        --port "$PORT" $SMALL --data synthetic:64 --iters 2 --no-eval \
        --precision bf16-amp > "$TMP/avx2.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] &&
        grep -q "bf16-amp: oneDNN .* has no bfloat16 convolution for this CPU" \
            "$TMP/avx2.log" &&
        grep -q "MESHTRAIN_CPU_BF16=emulate" "$TMP/avx2.log"
    t_ok $? "AVX2: bf16-amp refused at start, saying why (exit $rc)"
    [ $rc -eq 1 ] || t_show "$TMP/avx2.log"
    # shellcheck disable=SC2086
    MESHTRAIN_CPU_BF16=emulate DNNL_MAX_CPU_ISA=AVX2 "$MESHTRAIN" \
        -H localhost:1 --insecure --port "$PORT" ${SMALL% --quiet} \
        --data synthetic:64 --iters 2 --no-eval --precision bf16-amp \
        > "$TMP/emu.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q "bf16-amp (emulated" "$TMP/emu.log"
    t_ok $? "AVX2: MESHTRAIN_CPU_BF16=emulate trains, emulated (exit $rc)"
    [ $rc -eq 0 ] || t_show "$TMP/emu.log"
fi

# 2. convergence, fp32 against bf16-amp from the same seeds
train() { # train PREC SEED PORT: one peer, 1 epoch, log $TMP/PREC-SEED.log
    # shellcheck disable=SC2086
    "$MESHTRAIN" -H localhost:1 --insecure --port "$3" \
        ${SMALL% --quiet} --data fashion-mnist --batch 32 --epochs 1 \
        --lr 0.1 --lr-schedule cosine --warmup-epochs 0.1 \
        --weight-decay 5e-4 --seed "$2" --precision "$1" \
        --log-every 100000 > "$TMP/$1-$2.log" 2>&1
}
top1() {
    sed -n 's/.*test accuracy.*top-1 \([0-9.]*\) %.*/\1/p' "$1" | tail -n 1
}
take_ports 2 || exit 99
# A CPU whose oneDNN has no bfloat16 kernels refuses bf16-amp (part 1):
# there the convergence of its numbers is checked on the emulation.
# shellcheck disable=SC2086
"$MESHTRAIN" -H localhost:1 --insecure --port "$PORT" $SMALL \
    --data synthetic:64 --iters 1 --no-eval --precision bf16-amp \
    > "$TMP/probe.log" 2>&1 ||
    if grep -q "no bfloat16 convolution for this CPU" "$TMP/probe.log"; then
        t_diag "no bfloat16 kernels in oneDNN here: MESHTRAIN_CPU_BF16=emulate"
        export MESHTRAIN_CPU_BF16=emulate
    fi
codes=""
for seed in 1 2; do
    train fp32 $seed "$PORT" &
    p1=$!
    train bf16-amp $seed $((PORT + 1)) &
    p2=$!
    wait $p1
    c1=$?
    wait $p2
    codes="$codes $c1 $?"
done
[ "$codes" = " 0 0 0 0" ]
t_ok $? "four runs of one epoch (exit codes$codes)"
for f in "$TMP"/*-[12].log; do
    [ "$(top1 "$f")" ] || t_show "$f" 10
done
grep -q "bf16-amp (oneDNN bfloat16 kernels\|bf16-amp (emulated" \
    "$TMP/bf16-amp-1.log"
t_ok $? "the bf16-amp runs say which bfloat16 they run: \
$(sed -n 's/.*\(bf16-amp ([^)]*)\).*/\1/p' "$TMP/bf16-amp-1.log" | head -n 1)"
f1=$(top1 "$TMP/fp32-1.log")
f2=$(top1 "$TMP/fp32-2.log")
b1=$(top1 "$TMP/bf16-amp-1.log")
b2=$(top1 "$TMP/bf16-amp-2.log")
t_diag "top-1: fp32 ${f1:-none} / ${f2:-none}, bf16-amp ${b1:-none} / ${b2:-none}"
awk -v a="$b1" -v b="$b2" 'BEGIN { exit !(a >= 87 && b >= 87) }'
t_ok $? "every bf16-amp run reaches >= 87 % (${b1:-none}, ${b2:-none})"
d=$(awk -v a="$f1" -v b="$f2" -v c="$b1" -v e="$b2" 'BEGIN {
    if (a == "" || b == "" || c == "" || e == "") print "none"
    else printf "%+.2f", (c + e - a - b) / 2 }')
awk -v d="$d" 'BEGIN { exit !(d != "none" && d >= -0.8 && d <= 0.8) }'
t_ok $? "bf16-amp's mean top-1 within 0.8 points of fp32's ($d)"
t_done
