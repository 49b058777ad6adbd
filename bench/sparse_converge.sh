#!/bin/sh
# bench/sparse_converge.sh: the issue's convergence bar for sparsified
# gradients, in full: the demo's job (4 peers under meshrun, a ResNet-18 of
# width 16 with the CIFAR stem on 14 x 14 Fashion-MNIST, batch 32 per
# peer, 3 epochs, cosine schedule; tests/train_converge.sh) once per
# --compress value, side by side, printing each one's test top-1 and CPU
# time. The goal: topk:0.01 >= 88 % where none (float32) reaches 90 %.
# make check runs a 2-epoch version of it (tests/train_sparse_converge.sh).
#
#   bench/sparse_converge.sh [--series "none topk:0.01 ..."] [--epochs E]
#                            [--extra "ARGS"] [--builddir DIR]
#
# Each run takes about 2.5 CPU-minutes. --extra adds arguments to every
# run (--no-error-feedback, say).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
builddir=$here
series="none topk:0.01"
epochs=3
extra=
while [ $# -gt 0 ]; do
    case $1 in
    --series) series=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --extra) extra=$2; shift 2 ;;
    --builddir) builddir=$2; shift 2 ;;
    -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bench/sparse_converge.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
if [ ! -x "$builddir/meshtrain" ] || [ ! -x "$builddir/meshrun" ]; then
    echo "bench/sparse_converge.sh: build first (or --builddir)" >&2
    exit 1
fi
fm=/usr/share/datasets/fashion-mnist
[ -r "$fm/train-images-idx3-ubyte.gz" ] ||
    { echo "bench/sparse_converge.sh: no Fashion-MNIST in $fm" >&2; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparse_converge.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
port=$((20000 + $$ % 1000 * 8))
export OMP_WAIT_POLICY=passive

printf '%-22s %8s %8s %10s\n' compress top-1 top-5 cpu-s
for c in $series; do
    # shellcheck disable=SC2086
    /usr/bin/time -f '%U %S' -o "$tmp/time" "$builddir/meshrun" -np 4 \
        -H localhost:4 -- "$builddir/meshtrain" --port "$port" \
        --model resnet18 --width 16 --cifar-stem --image-size 14 \
        --data fashion-mnist --batch 32 --epochs "$epochs" --lr 0.1 \
        --lr-schedule cosine --warmup-epochs 0.1 --weight-decay 5e-4 \
        --algo ring --threads 1 --data-threads 1 --log-every 200 \
        --compress "$c" $extra >"$tmp/run.log" 2>&1
    rc=$?
    acc=$(sed -n 's/.*test accuracy.*top-1 \([0-9.]*\) % top-5 \([0-9.]*\) %.*/\1 \2/p' \
        "$tmp/run.log" | tail -n 1)
    cpu=$(awk '{ print $1 + $2 }' "$tmp/time" 2>/dev/null)
    [ $rc -eq 0 ] || { acc="failed(exit $rc)"; tail -n 5 "$tmp/run.log" >&2; }
    # shellcheck disable=SC2086
    printf '%-22s %8s %8s %10s\n' "$c" ${acc:-? ?} "${cpu:-?}"
done
