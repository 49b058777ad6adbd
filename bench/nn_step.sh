#!/bin/sh
# bench/nn_step.sh: ResNet-50 training step (forward, backward, SGD), batch
# 32, meshtrain's nn (oneDNN) against torchvision on PyTorch in the same run,
# at 224x224 and 32x32, 2 threads, in fp32 and in bfloat16 mixed precision:
# ours --precision bf16-amp, PyTorch's torch.autocast("cpu", bfloat16).
# Prints s/iter, img/s, CPU seconds per step and peak RSS of each, the
# ratios of images/s, and our time per op type.
#
#   bench/nn_step.sh [BUILDDIR]
#
# Environment: ITERS224=2 ITERS32=5 THREADS=2 SIZES="32 224" BATCH=32;
# TORCH_PYTHONS="/usr/bin/python3 VENV/bin/python": each a Python with
# torch and torchvision (default: Debian's, and the venv of
# bench/torch_venv.sh when it exists). Where our bf16-amp is refused (no
# bfloat16 kernels in oneDNN for this CPU), it runs again with
# MESHTRAIN_CPU_BF16=emulate and says so. On a loaded machine compare the
# CPU-s/iter columns: wall time then measures the neighbours too.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
bench="$build/bench/nn_bench"
[ -x "$bench" ] || { echo "nn_step.sh: build $bench first (make bench/nn_bench)" >&2; exit 2; }
threads=${THREADS:-2}
batch=${BATCH:-32}
venv=${TORCH_VENV:-$here/../.venv-torch}
pythons=${TORCH_PYTHONS:-/usr/bin/python3}
[ -z "${TORCH_PYTHONS:-}" ] && [ -x "$venv/bin/python" ] &&
    pythons="$pythons $venv/bin/python"

# img/s of a result line ("... 12.3 img/s ...")
ips() { echo "$1" | sed -n 's/.* \([0-9.]*\) img\/s.*/\1/p' | head -1; }
ratio() { awk -v a="$2" -v b="$3" -v w="$1" 'BEGIN {
    if (a > 0 && b > 0) printf "  %-44s %.2fx\n", w, a / b }'; }

for size in ${SIZES:-32 224}; do
    if [ "$size" -ge 200 ]; then iters=${ITERS224:-2}; else iters=${ITERS32:-5}; fi
    echo "== resnet50 batch $batch ${size}x${size}, $threads threads, $iters timed iterations (1 warmup)"
    run_ours() {
        "$bench" --model resnet50 --batch "$batch" --image-size "$size" \
            --iters "$iters" --warmup 1 --threads "$threads" --precision "$1"
    }
    ours=$(run_ours fp32 2>/dev/null)
    echo "$ours"
    if ! bf=$(run_ours bf16-amp 2>"${TMPDIR:-/tmp}/nn_step.$$"); then
        echo "# bf16-amp: $(tail -n 1 "${TMPDIR:-/tmp}/nn_step.$$")"
        echo "# again with MESHTRAIN_CPU_BF16=emulate (float32 on rounded operands)"
        bf=$(MESHTRAIN_CPU_BF16=emulate run_ours bf16-amp 2>/dev/null)
    fi
    rm -f "${TMPDIR:-/tmp}/nn_step.$$"
    echo "$bf" | sed -n 1,2p
    a=$(ips "$ours")
    b=$(ips "$bf")
    ratio "ours bf16-amp / ours fp32" "$b" "$a"
    for py in $pythons; do
        for prec in fp32 bf16; do
            t=$("$py" "$here/nn_step_torch.py" resnet50 "$batch" "$size" \
                "$iters" 1 "$threads" "$prec" 2>/dev/null) ||
                { echo "# $py: no torch/torchvision run"; continue; }
            echo "$t"
            v=$(echo "$t" | cut -d' ' -f2)
            if [ "$prec" = fp32 ]; then
                ratio "ours fp32 / pytorch $v fp32" "$a" "$(ips "$t")"
            else
                ratio "ours bf16-amp / pytorch $v autocast bf16" "$b" "$(ips "$t")"
            fi
        done
    done
    echo "our time per op type, fp32:"
    echo "$ours" | sed -n '/^time per op/,$p' | tail -n +2
    echo "our time per op type, bf16-amp:"
    echo "$bf" | sed -n '/^time per op/,$p' | tail -n +2
done
