#!/bin/sh
# tests/nn_kernels.sh: no convolution of the cpu backend runs on oneDNN's
# reference ("ref") implementation, a scalar loop 30 to 100 times slower
# than its JIT and GEMM kernels. oneDNN 2.6 picks it for the weight
# gradient of a 3x3 convolution on 2x2 or 1x1 maps and of a one-channel
# stem, on blocked activations; the plan then runs that gradient on plain
# copies (nn/cpu_dnnl.c, plan_conv_bwdw_plain). One training step per
# shape, read from ONEDNN_VERBOSE: which kernel ran is asserted, not how
# long it took.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

"$MESHTRAIN" --help 2>&1 | grep -q "oneDNN\|cpu" ||
    t_skip_all "meshtrain has no cpu backend"
# model width stem size in-channels
set -- \
    "resnet18 16 cifar 14 1" \
    "resnet18 16 cifar 28 1" \
    "resnet18 8 cifar 32 3" \
    "resnet18 64 imagenet 64 3" \
    "resnet34 8 cifar 16 3" \
    "resnet34 8 imagenet 40 1" \
    "resnet50 8 cifar 14 1" \
    "resnet50 8 cifar 32 3" \
    "resnet50 8 imagenet 64 3" \
    "resnet101 8 cifar 8 3"
t_plan $#
for shape in "$@"; do
    # shellcheck disable=SC2086
    set -- $shape
    stem=
    [ "$3" = cifar ] && stem=--cifar-stem
    ONEDNN_VERBOSE=1 "$MESHTRAIN" -H localhost:1 --insecure --model "$1" \
        --width "$2" $stem --image-size "$4" --in-channels "$5" \
        --num-classes 10 --data synthetic:64 --batch 4 --iters 1 --no-eval \
        --threads 1 --data-threads 1 --quiet > "$TMP/v.log" 2>&1
    rc=$?
    grep '^onednn_verbose,exec,cpu,convolution,' "$TMP/v.log" > "$TMP/conv"
    n=$(wc -l < "$TMP/conv")
    ref=$(grep -c '^onednn_verbose,exec,cpu,convolution,ref' "$TMP/conv")
    [ $rc -eq 0 ] && [ "$n" -gt 0 ] && [ "$ref" -eq 0 ]
    t_ok $? "$shape: $n convolutions ran, $ref on the reference kernel (exit $rc)"
    if [ "$ref" -ne 0 ] || [ $rc -ne 0 ]; then
        grep '^onednn_verbose,exec,cpu,convolution,ref' "$TMP/conv" |
            cut -d, -f5-6,11 | sort | uniq -c | head -n 5 | sed 's/^/# /'
        [ $rc -ne 0 ] && tail -n 5 "$TMP/v.log" | sed 's/^/# /'
    fi
done
t_done
