#!/bin/sh
# bench/data_loader.sh: imagefolder JPEG loader throughput (images/s) at
# 224x224 with 2 threads on a generated set of 500 JPEGs of 500x375, to
# compare with what training consumes (ResNet-50 at 224: about 3 img/s on
# 2 CPU cores, thousands per second on a GPU).
#   bench/data_loader.sh [THREADS] [DIR]
# Run from the build directory after make.
set -e
THREADS=${1:-2}
DIR=${2:-${TMPDIR:-/tmp}/meshtrain-jpegs-500x375}
BIN=${BIN:-./bench/data_loader}
[ -x "$BIN" ] || { echo "build first: make bench/data_loader" >&2; exit 1; }
"$BIN" --dir "$DIR" --count 500 --width 500 --height 375 \
       --threads "$THREADS" --size 224 --batch 32
