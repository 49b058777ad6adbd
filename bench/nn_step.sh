#!/bin/sh
# bench/nn_step.sh: ResNet-50 training step (forward, backward, SGD), batch
# 32, meshtrain's nn (oneDNN) against torchvision on PyTorch in the same run,
# at 224x224 and 32x32, 2 threads. Prints s/iter, img/s, peak RSS of both,
# the ratio of images/s, and our time per op type.
#
#   bench/nn_step.sh [BUILDDIR]     (environment: ITERS224=2 ITERS32=5
#                                    THREADS=2 SIZES="32 224" BATCH=32)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
bench="$build/bench/nn_bench"
[ -x "$bench" ] || { echo "nn_step.sh: build $bench first (make bench/nn_bench)" >&2; exit 2; }
threads=${THREADS:-2}
batch=${BATCH:-32}
for size in ${SIZES:-32 224}; do
    if [ "$size" -ge 200 ]; then iters=${ITERS224:-2}; else iters=${ITERS32:-5}; fi
    echo "== resnet50 batch $batch ${size}x${size}, $threads threads, $iters timed iterations (1 warmup)"
    ours=$("$bench" --model resnet50 --batch "$batch" --image-size "$size" \
           --iters "$iters" --warmup 1 --threads "$threads" 2>/dev/null)
    echo "$ours"
    theirs=$(/usr/bin/python3 "$here/nn_step_torch.py" resnet50 "$batch" "$size" \
             "$iters" 1 "$threads" 2>/dev/null)
    echo "$theirs"
    a=$(echo "$ours" | sed -n 's/.* \([0-9.]*\) img\/s.*/\1/p' | head -1)
    b=$(echo "$theirs" | sed -n 's/.* \([0-9.]*\) img\/s.*/\1/p' | head -1)
    ra=$(echo "$ours" | sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p' | head -1)
    rb=$(echo "$theirs" | sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p' | head -1)
    awk -v a="$a" -v b="$b" -v ra="$ra" -v rb="$rb" 'BEGIN {
        printf "ratio (meshtrain / pytorch): %.2fx img/s, %.2fx peak RSS\n", a / b, ra / rb }'
done
