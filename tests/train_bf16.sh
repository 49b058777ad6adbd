#!/bin/sh
# tests/train_bf16.sh: meshtrain --precision bf16-amp on the cpu backend.
#
# 1. With oneDNN capped to AVX2 (DNNL_MAX_CPU_ISA), which has no bfloat16
#    kernels, bf16-amp stops at start with exit 1 and a message that says
#    why and names MESHTRAIN_CPU_BF16=emulate; with that set, it trains.
# 2. Convergence at the demo's size: scripts/demo.sh (4 peers, ResNet-18
#    of width 16 on 14 x 14 Fashion-MNIST, 3 epochs, cosine schedule) in
#    fp32 and in bf16-amp from the same seed, so with the same initial
#    weights and the same data order: both reach the demo's 90 %, and
#    bf16-amp's test top-1 lies within 0.3 points of fp32's (issue 29).
#    Why one pair at the full size: within this budget (two demo runs)
#    the alternatives are noisier. At 1 epoch (the previous version: four
#    runs of one peer) the seed alone moved fp32 by 0.4 points and a pair
#    by up to 0.5; at 3 epochs the pairs of seeds 1, 2 and 3 differed by
#    -0.15, +0.29 and +0.10 (fp32 90.72 / 90.39 / 90.47, bench/
#    bf16_converge.sh SEEDS="1 2 3"; sd 0.22), and a mean over k seeds
#    costs 2 k demo runs. Both runs are deterministic (one thread per
#    peer, sums in rank order), so on a given CPU the result is a fixed
#    number and the test does not flake; on a CPU with other kernels it is
#    a new draw from that spread, which 0.3 covers at about 1.4 sd. With
#    oneDNN capped to AVX2 (bf16-amp emulated) seed 1 gave fp32 90.61 %,
#    bf16-amp 90.56 % (-0.05 points); here 90.72 % and 90.57 %.
#    Two runs of about 150 CPU-seconds, at once (about 150 s alone on 2
#    cores).
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

# 2. convergence at the demo's size, fp32 against bf16-amp, one seed
take_ports 8 || exit 99
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
demo() { # demo PREC PORT: scripts/demo.sh in PREC, log $TMP/PREC.log
    MESHTRAIN_BUILDDIR=$top_builddir MESHTRAIN_FASHION_MNIST=$FMNIST \
        "$top_srcdir/scripts/demo.sh" --precision "$1" --seed "$SEED" \
        --port "$2" --log-every 100000 > "$TMP/$1.log" 2>&1
}
top1() {
    sed -n 's/.*test accuracy.*top-1 \([0-9.]*\) %.*/\1/p' "$1" | tail -n 1
}
SEED=1
demo fp32 "$PORT" &
p1=$!
demo bf16-amp $((PORT + 4)) &
p2=$!
wait $p1
c1=$?
wait $p2
c2=$?
[ $c1 -eq 0 ] && [ $c2 -eq 0 ]
t_ok $? "the demo (4 peers, 3 epochs) in fp32 and in bf16-amp, seed $SEED \
(exit codes $c1 $c2)"
for f in "$TMP/fp32.log" "$TMP/bf16-amp.log"; do
    [ "$(top1 "$f")" ] || t_show "$f" 10
done
grep -q "bf16-amp (oneDNN bfloat16 kernels\|bf16-amp (emulated" \
    "$TMP/bf16-amp.log"
t_ok $? "the bf16-amp run says which bfloat16 it runs: \
$(sed -n 's/.*\(bf16-amp ([^)]*)\).*/\1/p' "$TMP/bf16-amp.log" | head -n 1)"
f=$(top1 "$TMP/fp32.log")
b=$(top1 "$TMP/bf16-amp.log")
awk -v a="$f" -v b="$b" 'BEGIN { exit !(a >= 89.5 && b >= 89.5) }'
t_ok $? "both reach the demo's 90 % (fp32 ${f:-none} %, bf16-amp ${b:-none} %)"
d=$(awk -v a="$f" -v b="$b" 'BEGIN {
    if (a == "" || b == "") print "none"; else printf "%+.2f", b - a }')
awk -v d="$d" 'BEGIN { exit !(d != "none" && d >= -0.3 && d <= 0.3) }'
t_ok $? "bf16-amp's top-1 within 0.3 points of fp32's ($d)"
t_done
