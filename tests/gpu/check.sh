#!/bin/sh
# tests/gpu/check.sh: everything the GPU half needs proven, in one run of
# under 10 minutes on a machine with an NVIDIA GPU and no internet:
#   1. build from a `make dist` tarball (sh, make, a C compiler and the CUDA
#      toolkit's nvcc; no autotools), for the GPU's own architecture only;
#      cuDNN and cuBLAS from the toolkit, the system, or the nvidia-cudnn-*
#      / nvidia-cublas-* wheels of the machine's Python when the toolkit
#      lacks them;
#   2. run the GPU tests: tests/test_nn_cuda (every op and a ResNet-50 step
#      against the cpu backend), tests/test_nn_ops on the cuda backend
#      (against double references; NVIDIA_TF32_OVERRIDE=0 keeps it fp32),
#      tests/gpu/two_peers.sh (2 peers on one GPU over loopback TCP);
#   3. time ResNet-50 training at batch 32, 64, 128 in fp32, tf32 and
#      bf16-amp (tests/gpu/nn_time), and PyTorch's torchvision resnet50 in
#      the same settings when torch with CUDA is importable;
#   4. write OUTDIR/table.md (and every log next to it).
#
# usage: tests/gpu/check.sh [TARBALL] [OUTDIR]
#   TARBALL defaults to the newest meshtrain-*.tar.gz in the current
#   directory or the source tree, else `make dist` in the build tree the
#   script lives in; OUTDIR defaults to $OUT, else ./gpu-check.
# Environment: CUDA_HOME (toolkit, default: nvcc's, else /usr/local/cuda),
# PYTHON (default python3), JOBS (make -j, default nproc).
# Exit status: 0 when every test passed, 1 when one failed, 2 when the
# build failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)
srctree=$(cd "$here/../.." && pwd)
TARBALL=${1:-}
OUTDIR=${2:-${OUT:-$PWD/gpu-check}}
PYTHON=${PYTHON:-python3}
export PYTHON # for two_peers.sh
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
T0=$(date +%s)
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/check.log
: > "$LOG"

say() { echo "check.sh [$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - T0)); }

# ---- 1. the tarball and the toolkit ---------------------------------------
if [ -z "$TARBALL" ]; then
    TARBALL=$(ls -t ./meshtrain-*.tar.gz "$srctree"/meshtrain-*.tar.gz \
        2>/dev/null | head -n 1)
fi
if [ -z "$TARBALL" ] && [ -f "$srctree/Makefile" ]; then
    say "no tarball: make dist in $srctree"
    (cd "$srctree" && make dist) >> "$LOG" 2>&1 || {
        say "make dist failed"; exit 2; }
    TARBALL=$(ls -t "$srctree"/meshtrain-*.tar.gz | head -n 1)
fi
[ -f "$TARBALL" ] || { say "no tarball (give one as the first argument)"; exit 2; }
TARBALL=$(cd "$(dirname "$TARBALL")" && pwd)/$(basename "$TARBALL")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshgpu.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT INT TERM
say "unpacking $TARBALL in $WORK"
tar -xzf "$TARBALL" -C "$WORK" || { say "cannot unpack"; exit 2; }
SRC=$(ls -d "$WORK"/meshtrain-* | head -n 1)

if [ -z "${CUDA_HOME:-}" ]; then
    if command -v nvcc > /dev/null 2>&1; then
        CUDA_HOME=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
    else
        CUDA_HOME=/usr/local/cuda
    fi
fi
[ -x "$CUDA_HOME/bin/nvcc" ] || { say "no nvcc in $CUDA_HOME/bin"; exit 2; }
PATH=$CUDA_HOME/bin:$PATH
export PATH

# Headers and libraries of cuDNN and cuBLAS: the toolkit, the system, or a
# Python wheel (nvidia/cudnn/{include,lib}, libraries named *.so.N only, so
# an unversioned link is made for the linker).
XCPP=""
XLD=""
XLIBPATH=""
mkdir -p "$WORK/links"
wheel_dir() {
    "$PYTHON" -c "import nvidia.$1 as m; print(list(m.__path__)[0])" \
        2>/dev/null
}
find_lib() { # NAME HEADER WHEEL
    if [ -f "$CUDA_HOME/include/$2" ] || [ -f "/usr/include/$2" ] ||
        [ -f "/usr/include/x86_64-linux-gnu/$2" ]; then
        say "$1: $2 found in the toolkit or the system"
        return 0
    fi
    d=$(wheel_dir "$3")
    if [ -n "$d" ] && [ -f "$d/include/$2" ]; then
        so=$(ls "$d"/lib/lib"$1".so* 2>/dev/null | head -n 1)
        [ -n "$so" ] && ln -sf "$so" "$WORK/links/lib$1.so"
        XCPP="$XCPP -I$d/include"
        XLD="$XLD -L$WORK/links -Wl,-rpath,$d/lib"
        XLIBPATH="$XLIBPATH:$d/lib"
        say "$1: from the Python wheel in $d"
        return 0
    fi
    say "$1: no $2 in $CUDA_HOME, /usr/include or $PYTHON's nvidia.$3"
    return 1
}
find_lib cudnn cudnn.h cudnn || exit 2
find_lib cublas cublas_v2.h cublas || exit 2
LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}$XLIBPATH
export LD_LIBRARY_PATH

ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    head -n 1 | tr -d ' .')
if [ -n "$ARCH" ]; then
    ARCH=sm_$ARCH
else
    ARCH=sm_80,sm_90
fi
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
    2>/dev/null | head -n 1)
say "GPU: ${GPU:-unknown (no nvidia-smi)}; building for $ARCH"

BUILD=$WORK/build
mkdir -p "$BUILD"

# The nn part alone, built by hand when configure cannot run (a GPU machine
# without libevent-dev, libssl-dev or pkg-config): the nn sources, the
# collective's conversions, the base layer (common/), oneDNN's cpu backend
# when its header is there; then
# test_nn_cuda, test_nn_ops and nn_time. two_peers.sh needs the full build.
fallback_build() {
    NVARCH=$(echo "$ARCH" | tr ',' ' ')
    GENCODE=""
    for a in $NVARCH; do
        n=${a#sm_}
        GENCODE="$GENCODE -gencode arch=compute_$n,code=sm_$n"
    done
    DNNL=""
    {
        echo "#define _GNU_SOURCE 1"
        echo "#define HAVE_CUDA 1"
        if [ -f /usr/include/oneapi/dnnl/dnnl.h ]; then
            echo "#define HAVE_DNNL 1"
            DNNL="nn/cpu_dnnl.c nn/cpu_bn.c nn/devsim.c" # ctx.c lists them
        fi
    } > "$BUILD/config.h"
    CFL="-std=gnu11 -O2 -pthread -I$BUILD -I$SRC -I$CUDA_HOME/include $XCPP"
    mkdir -p "$BUILD/obj" "$BUILD/tests/gpu"
    # shellcheck disable=SC2086
    for f in common/util.c common/dtype.c collective/reduce.c nn/ctx.c nn/resnet.c nn/optim.c \
        nn/weights.c nn/safetensors.c nn/safetensors_json.c nn/stream.c \
        nn/cuda/cuda.c nn/cuda/host.c common/array.c $DNNL; do
        gcc $CFL -c "$SRC/$f" -o "$BUILD/obj/$(echo "$f" | tr / _).o" ||
            return 1
    done
    # shellcheck disable=SC2086
    nvcc -O3 -std=c++17 $GENCODE -I"$BUILD" -I"$SRC" \
            -c "$SRC/nn/cuda/kernels.cu" -o "$BUILD/obj/kernels.o" &&
        ar cr "$BUILD/libnn.a" "$BUILD"/obj/*.o || return 1
    LIBS="-L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 $XLD"
    [ -n "$DNNL" ] && LIBS="$LIBS -ldnnl -lgomp"
    LIBS="$LIBS -lcudnn -lcublas -lcudart -lstdc++ -lm"
    for t in tests/test_nn_cuda tests/test_nn_ops tests/gpu/nn_time; do
        # shellcheck disable=SC2086
        gcc $CFL "$SRC/$t.c" "$BUILD/libnn.a" $LIBS -o "$BUILD/$t" ||
            return 1
    done
}

say "configure"
if (cd "$BUILD" && "$SRC/configure" --with-cuda="$CUDA_HOME" \
    --with-cuda-arch="$ARCH" CPPFLAGS="$XCPP" LDFLAGS="$XLD") \
    > "$OUTDIR/configure.log" 2>&1; then
    grep -q 'CUDA/cuDNN/cuBLAS *yes' "$OUTDIR/configure.log" || {
        say "configure did not enable CUDA: see $OUTDIR/configure.log"
        exit 2
    }
    say "make -j$JOBS"
    (cd "$BUILD" && make -j"$JOBS" && make -j"$JOBS" check TESTS=) \
        > "$OUTDIR/make.log" 2>&1 || {
        say "build failed: see $OUTDIR/make.log"; exit 2; }
else
    say "configure failed ($(tail -n 1 "$OUTDIR/configure.log")):" \
        "building the nn part by hand"
    fallback_build > "$OUTDIR/make.log" 2>&1 || {
        say "build failed: see $OUTDIR/make.log"; exit 2; }
fi

# ---- 2. the GPU tests -------------------------------------------------------
FAILED=0
run_tap() { # NAME TIMEOUT COMMAND...
    name=$1
    secs=$2
    shift 2
    (cd "$BUILD" && top_srcdir=$SRC top_builddir=$BUILD \
        timeout "$secs" "$@") > "$OUTDIR/$name.tap" 2>&1
    rc=$?
    n_ok=$(grep -c '^ok' "$OUTDIR/$name.tap")
    n_bad=$(grep -c '^not ok' "$OUTDIR/$name.tap")
    skip=$(grep -m 1 '^1\.\.0 # SKIP' "$OUTDIR/$name.tap")
    if [ "$n_bad" -ne 0 ] || [ $rc -ne 0 ] ||
        grep -q '^Bail out' "$OUTDIR/$name.tap"; then
        FAILED=1
        say "FAIL $name: $n_ok ok, $n_bad not ok, exit $rc"
        grep '^not ok\|^Bail' "$OUTDIR/$name.tap" | head -n 20 | tee -a "$LOG"
    elif [ -n "$skip" ]; then
        say "SKIP $name: $skip"
    else
        say "PASS $name: $n_ok ok"
    fi
}
run_tap test_nn_cuda 300 ./tests/test_nn_cuda
run_tap test_nn_ops_cuda 120 env NVIDIA_TF32_OVERRIDE=0 \
    MESHTRAIN_NN_BACKEND=cuda ./tests/test_nn_ops
run_tap two_peers 240 sh "$SRC/tests/gpu/two_peers.sh"

# ---- 3. timing ----------------------------------------------------------------
TABLE=$OUTDIR/table.md
{
    echo "# ResNet-50 training on one GPU: ${GPU:-unknown}"
    echo
    echo "img/s, 20 steps after 5 warmup steps, random 224x224 images;"
    echo "meshtrain = tests/gpu/nn_time (nn cuda backend), torch ="
    echo "tests/gpu/torch_time.py (torchvision resnet50, eager)."
    echo
    echo "| precision | batch | meshtrain img/s | torch img/s | ratio |"
    echo "|---|---:|---:|---:|---:|"
} > "$TABLE"
have_torch=1
for b in 32 64 128; do
    for p in fp32 tf32 bf16-amp; do
        if [ "$(elapsed)" -gt 540 ]; then
            say "time budget spent: batch $b $p not timed"
            echo "| $p | $b | not timed | not timed | |" >> "$TABLE"
            continue
        fi
        ours=$(cd "$BUILD" && timeout 90 ./tests/gpu/nn_time -d cuda -p "$p" \
            -b "$b" -s 20 -w 5 2>> "$OUTDIR/nn_time.err" |
            tee -a "$OUTDIR/nn_time.log" | sed -n 's/.*img_s=\([0-9.]*\).*/\1/p')
        theirs=""
        if [ $have_torch -eq 1 ]; then
            theirs=$(timeout 120 "$PYTHON" "$SRC/tests/gpu/torch_time.py" \
                "$p" "$b" 20 5 2>> "$OUTDIR/torch_time.err" |
                tee -a "$OUTDIR/torch_time.log" |
                sed -n 's/.*img_s=\([0-9.]*\).*/\1/p')
            if [ -z "$theirs" ] &&
                ! "$PYTHON" -c 'import torch, torchvision
assert torch.cuda.is_available()' > /dev/null 2>&1; then
                have_torch=0
                say "PyTorch with CUDA and torchvision not importable: no reference"
            fi
        fi
        ratio=""
        if [ -n "$ours" ] && [ -n "$theirs" ]; then
            ratio=$(awk -v a="$ours" -v b="$theirs" \
                'BEGIN { printf "%.2f", a / b }')
        fi
        echo "| $p | $b | ${ours:-failed} | ${theirs:--} | $ratio |" >> "$TABLE"
        say "batch $b $p: meshtrain ${ours:-failed} img/s, torch ${theirs:--}"
        [ -n "$ours" ] || FAILED=1
    done
done
echo >> "$TABLE"
echo "tests: $(grep -h '^check.sh.*\(PASS\|FAIL\|SKIP\)' "$LOG" |
    sed 's/^check.sh \[[0-9]*s\] //' | tr '\n' ';')" >> "$TABLE"
say "done in $(elapsed) s; table in $TABLE"
cat "$TABLE"
exit $FAILED
