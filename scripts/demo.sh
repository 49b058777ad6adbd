#!/bin/sh
# scripts/demo.sh: the first real job on a fresh machine. 4 peers on this
# machine (meshrun, a fresh secret per job) train a small ResNet-18 (width
# 16, CIFAR stem, 14 x 14 inputs, 0.7 M parameters) on Fashion-MNIST with
# synchronous data-parallel SGD, then print the test accuracy (about 90 %
# after 3 epochs; a minute or two on 2 cores). Run it from the build
# directory, or set MESHTRAIN_BUILDDIR. Extra arguments go to meshtrain
# (e.g. --epochs 1 for a quicker look, --timeline demo.json).
#   scripts/demo.sh [MESHTRAIN-ARGS...]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
builddir=${MESHTRAIN_BUILDDIR:-}
if [ -z "$builddir" ]; then
    if [ -x ./meshrun ]; then builddir=.; else builddir=$here; fi
fi
meshrun=$builddir/meshrun
meshtrain=$builddir/meshtrain
for p in "$meshrun" "$meshtrain"; do
    [ -x "$p" ] || { echo "demo.sh: $p is not built (run make first)" >&2
                     exit 1; }
done
data=${MESHTRAIN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] ||
    [ -r "$data/train-images-idx3-ubyte" ] || {
    echo "demo.sh: no Fashion-MNIST in $data (apt-get install" \
         "dataset-fashion-mnist, or set MESHTRAIN_FASHION_MNIST)" >&2
    exit 1
}

# A base port with 4 free ports after it (the default 29400 if free).
port=29400
if command -v /usr/bin/python3 >/dev/null 2>&1; then
    port=$(/usr/bin/python3 - <<'PY'
import random, socket
for base in [29400] + [random.randrange(20000, 60000) for _ in range(100)]:
    try:
        socks = []
        for p in range(base, base + 4):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    print(base); break
PY
)
fi

echo "demo: 4 peers on this machine train a ResNet-18 (width 16) on" \
     "Fashion-MNIST"
echo "demo: meshrun -np 4 -H localhost:4 -- meshtrain --data fashion-mnist ..."
# One compute thread per peer (4 peers share the cores); passive OpenMP
# waits so that idle threads do not spin on a shared machine.
OMP_WAIT_POLICY=passive MESHTRAIN_LOG=${MESHTRAIN_LOG:-warn} \
"$meshrun" -np 4 -H localhost:4 -- "$meshtrain" --port "$port" \
    --model resnet18 --width 16 --cifar-stem --image-size 14 \
    --data "fashion-mnist:$data" --batch 32 --epochs 3 --lr 0.1 \
    --lr-schedule cosine --warmup-epochs 0.1 --weight-decay 5e-4 \
    --algo ring --threads 1 --data-threads 1 --log-every 100 "$@"
rc=$?
if [ $rc -eq 0 ]; then
    echo "demo: ok: 4 peers trained in lockstep (weights checked identical" \
         "by digest) and evaluated the test set together"
else
    echo "demo: FAILED with exit code $rc (see meshtrain(1), EXIT STATUS)" >&2
fi
exit $rc
