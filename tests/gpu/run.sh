#!/bin/sh
# tests/gpu/run.sh: the one command for an offline machine with an NVIDIA
# GPU, the CUDA toolkit (nvcc, cuDNN and cuBLAS from the toolkit, the
# system or Python's nvidia-* wheels), a C compiler, sh and python3; no
# autotools, no -dev packages, no network. From the repository root:
#
#     sh tests/gpu/run.sh gpu-bundle
#
# with gpu-bundle/ made here by `make gpu-bundle` (tests/gpu/bundle.sh) and
# carried along (the device tool: carry ["gpu-bundle"]). In order:
#   1. unpack the bundle's .deb files with dpkg-deb -x into a private
#      prefix under a fresh temporary directory (never into /) and point
#      PKG_CONFIG_PATH, CPATH, LIBRARY_PATH and LD_LIBRARY_PATH at it; use
#      its pkgconf and make only when the machine has none;
#   2. configure the `make dist` tarball --with-cuda --with-dnnl for the
#      GPU's own architecture (nvidia-smi), build meshtrain and the GPU
#      tests;
#   3. the REQUIRED GPU tests: tests/test_nn_cuda (every op and a ResNet-50
#      step against the cpu backend, in fp32, tf32 and bf16-amp),
#      tests/test_nn_ops on the cuda backend (against double references),
#      tests/gpu/two_peers.sh (2 peers training on one GPU),
#      tests/gpu/elastic_catchup.sh (an --elastic joiner catches up on the
#      GPU while 2 peers train); a skip, a failure, a crash or a timeout of
#      any of them fails the run;
#   4. timing: ResNet-50 training at batch 128 in fp32, tf32 and bf16-amp,
#      tests/gpu/nn_time against tests/gpu/torch_time.py (PyTorch's best
#      settings) when torch with CUDA is importable;
#   4b. two peers training ResNet-50 on the GPU (meshrun), the share of
#      all-reduce time hidden behind backward read from the timeline
#      (bench/train_report.py; the goal is 90 %), not a pass/fail test;
#   5. compute-sanitizer memcheck, racecheck and synccheck on the op tests
#      (test_nn_ops, cuda) and on one training step of a small ResNet
#      (nn_time -a resnet18), counting the errors each reports.
# Every part has a time limit and the whole run ends within 480 s (parts
# that no longer fit are reported as not run). Output, exactly two files:
#   OUTDIR/summary.md      what ran, what passed, the timings, the counts;
#   OUTDIR/gpu-logs.tar.gz every log (configure, build, each test's TAP).
#
# usage: tests/gpu/run.sh BUNDLE [OUTDIR]
#   OUTDIR defaults to $OUT, else ./gpu-out.
# Environment: GPU_PARTS (default "tests timing overlap sanitize": which
# of parts 3 to 5 run), GPU_ARCH (e.g. sm_90; default: the GPU's own, else
# configure's default list), GPU_DEADLINE (seconds, default 470), PYTHON
# (default python3), JOBS (make -j, default nproc).
# Exit status: 0 when every required test passed and the sanitizers found
# no error; 1 when a required test skipped or failed, or a sanitizer
# reported errors; 2 when the bundle, configure or the build failed.
set -u

T0=$(date +%s)
BUNDLE=${1:-}
OUTDIR=${2:-${OUT:-$PWD/gpu-out}}
PARTS=${GPU_PARTS:-tests timing overlap sanitize}
DEADLINE=${GPU_DEADLINE:-470}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2> /dev/null || echo 4)}
MA=x86_64-linux-gnu

mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshgpu.XXXXXX") || exit 2
LOGS=$WORK/logs
mkdir -p "$LOGS"
SUM=$LOGS/summary.md
STATUS=0

elapsed() { echo $(($(date +%s) - T0)); }
say() { echo "run.sh [$(elapsed)s] $*" | tee -a "$LOGS/run.log"; }
note() { echo "$*" >> "$SUM"; }
# The seconds a part may take: its cap, or what is left before the
# deadline less 10 s for the archive, whichever is smaller.
budget() {
    b=$((DEADLINE - 10 - $(elapsed)))
    [ "$b" -gt "$1" ] && b=$1
    echo "$b"
}
finish() {
    rc=$1
    note ""
    note "exit status $rc after $(elapsed) s (0: all passed; 1: a required" \
        "test skipped or failed, or a sanitizer found errors; 2: no build)"
    cp "$SUM" "$OUTDIR/summary.md"
    say "done: $OUTDIR/summary.md, $OUTDIR/gpu-logs.tar.gz, exit $rc"
    tar -czf "$OUTDIR/gpu-logs.tar.gz" -C "$WORK" logs
    rm -rf "$WORK"
    exit "$rc"
}
fatal() {
    say "$*"
    note "**FATAL**: $*"
    finish 2
}

{
    echo "# meshtrain on a GPU: tests/gpu/run.sh"
    echo
    echo "- host: $(uname -srm), $JOBS jobs;" \
        "$( (. /etc/os-release && echo "$PRETTY_NAME") 2> /dev/null)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader 2> /dev/null | head -n 1)"
    echo "- parts: $PARTS; deadline $DEADLINE s"
} > "$SUM"

# ---- 1. the bundle, unpacked into a private prefix --------------------------
[ -n "$BUNDLE" ] && [ -d "$BUNDLE" ] ||
    fatal "usage: tests/gpu/run.sh BUNDLE [OUTDIR] (make gpu-bundle makes it)"
BUNDLE=$(cd "$BUNDLE" && pwd)
TARBALL=$(ls "$BUNDLE"/meshtrain-*.tar.gz 2> /dev/null | head -n 1)
[ -f "$TARBALL" ] || fatal "no meshtrain-*.tar.gz in $BUNDLE"
P=$WORK/prefix
mkdir -p "$P"
n=0
for deb in "$BUNDLE"/debs/*.deb; do
    [ -f "$deb" ] || fatal "no .deb files in $BUNDLE/debs"
    if command -v dpkg-deb > /dev/null 2>&1; then
        dpkg-deb -x "$deb" "$P" || fatal "dpkg-deb -x $deb failed"
    else # ar and tar: a .deb is an ar archive with data.tar.* in it
        (cd "$WORK" && ar x "$deb" && tar -xf data.tar.* -C "$P" &&
            rm -f data.tar.* control.tar.* debian-binary) ||
            fatal "cannot unpack $deb (no dpkg-deb; ar and tar failed)"
    fi
    n=$((n + 1))
done
# the .pc files name /usr: make them name the prefix
for pc in "$P"/usr/lib/$MA/pkgconfig/*.pc "$P"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i -e "s|=/usr\$|=$P/usr|" -e "s|=/usr/|=$P/usr/|" "$pc"
done
say "unpacked $n packages into $P"
LIB=$P/usr/lib/$MA
PKG_CONFIG_PATH=$LIB/pkgconfig:$P/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
CPATH=$P/usr/include:$P/usr/include/$MA${CPATH:+:$CPATH}
LIBRARY_PATH=$LIB${LIBRARY_PATH:+:$LIBRARY_PATH}
ORIG_LDLP=${LD_LIBRARY_PATH:-}
LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH CPATH LIBRARY_PATH LD_LIBRARY_PATH
mkdir -p "$WORK/bin"
if ! command -v pkg-config > /dev/null 2>&1; then
    # a wrapper: the bundle's pkgconf with the bundle's libpkgconf
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIB" \
        "$P/usr/bin/pkgconf" > "$WORK/bin/pkg-config"
    chmod +x "$WORK/bin/pkg-config"
    say "pkg-config: the bundle's pkgconf"
fi
if ! command -v make > /dev/null 2>&1; then
    ln -s "$P/usr/bin/make" "$WORK/bin/make"
    say "make: the bundle's"
fi
PATH=$WORK/bin:$PATH
export PATH
for t in cc gcc tar gzip sed awk timeout "$PYTHON"; do
    command -v "$t" > /dev/null 2>&1 || fatal "$t is not installed"
done

# ---- 2. CUDA, cuDNN, cuBLAS; configure; build ---------------------------------
if [ -z "${CUDA_HOME:-}" ]; then
    if command -v nvcc > /dev/null 2>&1; then
        CUDA_HOME=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
    else
        CUDA_HOME=/usr/local/cuda
    fi
fi
[ -x "$CUDA_HOME/bin/nvcc" ] || fatal "no nvcc in $CUDA_HOME/bin"
PATH=$CUDA_HOME/bin:$PATH
note "- CUDA: $CUDA_HOME, $(nvcc --version | tail -n 1)"

# Headers and libraries found outside the toolkit (the system or the
# Python wheels' nvidia/*/include and lib, whose libraries are named
# *.so.N only: an unversioned link is made for the linker).
WHEELS=$("$PYTHON" -c 'import nvidia; print(" ".join(nvidia.__path__))' \
    2> /dev/null)
XCPP=""
XLD=""
mkdir -p "$WORK/links"
find_dep() { # NAME HEADER
    hdr=""
    for d in "$CUDA_HOME/include" /usr/include /usr/include/$MA; do
        [ -f "$d/$2" ] && hdr=$d && break
    done
    [ -z "$hdr" ] && [ -n "$WHEELS" ] &&
        hdr=$(dirname "$(find $WHEELS -path "*/include/$2" 2> /dev/null |
            head -n 1)")
    [ "$hdr" = . ] && hdr=""
    if [ -z "$hdr" ] && [ -f "$BUNDLE/cudnn-include/$2" ]; then
        hdr=$BUNDLE/cudnn-include
        say "$1: the bundle's headers (from the machine that made it)"
    fi
    [ -n "$hdr" ] || fatal "$1: no $2 in $CUDA_HOME, /usr or the wheels"
    so=""
    for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/$MA; do
        so=$(ls "$d/lib$1.so" "$d/lib$1.so."* 2> /dev/null | head -n 1)
        [ -n "$so" ] && break
    done
    [ -z "$so" ] && [ -n "$WHEELS" ] &&
        so=$(find $WHEELS -name "lib$1.so*" 2> /dev/null | sort | head -n 1)
    [ -n "$so" ] || fatal "$1: no lib$1.so in $CUDA_HOME, /usr or the wheels"
    dir=$(dirname "$so")
    case "$hdr" in "$CUDA_HOME"/*) ;; *) XCPP="$XCPP -I$hdr" ;; esac
    case "$dir" in
    "$CUDA_HOME"/*) ;;
    *)
        [ -f "$dir/lib$1.so" ] || ln -sf "$so" "$WORK/links/lib$1.so"
        XLD="$XLD -L$dir -Wl,-rpath,$dir"
        LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$dir
        ;;
    esac
    say "$1: $hdr/$2, $so"
    note "- $1: $hdr/$2, $so"
}
find_dep cudnn cudnn.h
find_dep cublas cublas_v2.h
XLD="$XLD -L$WORK/links"

ARCH=${GPU_ARCH:-}
if [ -z "$ARCH" ]; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader \
        2> /dev/null | head -n 1 | tr -d ' .')
    [ -n "$cc" ] && ARCH=sm_$cc
fi
say "building for ${ARCH:-the default architectures of configure}"

tar -xzf "$TARBALL" -C "$WORK" || fatal "cannot unpack $TARBALL"
SRC=$(ls -d "$WORK"/meshtrain-*/ | head -n 1)
SRC=${SRC%/}
BUILD=$WORK/build
mkdir -p "$BUILD"
t=$(budget 120)
(cd "$BUILD" && timeout "$t" "$SRC/configure" --with-cuda="$CUDA_HOME" \
    ${ARCH:+--with-cuda-arch=$ARCH} --with-dnnl \
    CPPFLAGS="$XCPP" LDFLAGS="-L$LIB -Wl,-rpath,$LIB $XLD") \
    > "$LOGS/configure.log" 2>&1 ||
    fatal "configure failed: $(tail -n 1 "$LOGS/configure.log")"
cp "$BUILD/config.log" "$LOGS/config.log"
grep -q 'CUDA/cuDNN/cuBLAS *yes' "$LOGS/configure.log" ||
    fatal "configure did not enable CUDA (see configure.log)"
note "- configure: $(grep 'CUDA/cuDNN/cuBLAS' "$LOGS/configure.log" |
    sed 's/^ *//'); $(grep 'oneDNN' "$LOGS/configure.log" | sed 's/^ *//')"
say "configured; make -j$JOBS"
t=$(budget 200)
# two makes: `all` re-enters make, and a parallel sibling target would
# build libmesh.a's objects a second time at once
(cd "$BUILD" && timeout "$t" make -j"$JOBS" all &&
    timeout "$t" make -j"$JOBS" tests/test_nn_cuda tests/test_nn_ops) \
    > "$LOGS/make.log" 2>&1 ||
    fatal "the build failed or ran out of time: $(tail -n 1 "$LOGS/make.log")"
say "built in $(elapsed) s"
note "- built in $(elapsed) s from $(basename "$TARBALL")"
# the cuda backend is the module meshtrain-cuda.so, built next to meshtrain:
# the programs in tests/ find it through this variable
MESHTRAIN_CUDA_MODULE=$BUILD/meshtrain-cuda.so
export MESHTRAIN_CUDA_MODULE
[ -f "$MESHTRAIN_CUDA_MODULE" ] ||
    fatal "the build made no $MESHTRAIN_CUDA_MODULE (the cuda backend)"
note ""

# ---- 3. the required GPU tests -------------------------------------------------
# run_tap NAME CAP COMMAND...: a TAP program with a time limit; any skip,
# "not ok", missing result, exit status or timeout is a failure.
run_tap() {
    name=$1
    t=$(budget "$2")
    shift 2
    tap=$LOGS/$name.tap
    if [ "$t" -lt 10 ]; then
        STATUS=1
        say "FAIL $name: not run, out of time"
        note "- **FAIL** $name: not run, out of time"
        return
    fi
    (cd "$BUILD" && top_srcdir=$SRC top_builddir=$BUILD PYTHON=$PYTHON \
        timeout "$t" "$@") > "$tap" 2>&1
    rc=$?
    n_ok=$(grep -c '^ok' "$tap")
    n_bad=$(grep -c '^not ok' "$tap")
    plan=$(sed -n 's/^1\.\.\([0-9]*\).*/\1/p' "$tap" | head -n 1)
    why=$(grep -m 1 '^1\.\.0 *# *SKIP\|^ok.*# *SKIP' "$tap" | cut -c1-200)
    if [ "$rc" -eq 0 ] && [ "$n_bad" -eq 0 ] && [ -z "$why" ] &&
        [ -n "$plan" ] && [ "$plan" -gt 0 ] &&
        [ "$n_ok" -eq "$plan" ]; then
        say "PASS $name: $n_ok ok"
        note "- PASS $name: $n_ok/$plan ok"
        return
    fi
    STATUS=1
    if [ -n "$why" ]; then
        say "SKIP (a failure here) $name: $why"
        note "- **SKIP** (counts as a failure) $name: $why"
    else
        say "FAIL $name: $n_ok ok, $n_bad not ok of ${plan:-?}, exit $rc"
        note "- **FAIL** $name: $n_ok ok, $n_bad not ok of ${plan:-?}," \
            "exit $rc$([ "$rc" -eq 124 ] && echo ' (timeout)')"
        grep '^not ok\|^Bail' "$tap" | head -n 10 | sed 's/^/    /' >> "$SUM"
    fi
}

case " $PARTS " in *" tests "*)
    note "## Required GPU tests"
    note ""
    run_tap test_nn_cuda 150 ./tests/test_nn_cuda
    run_tap test_nn_ops_cuda 60 env NVIDIA_TF32_OVERRIDE=0 \
        MESHTRAIN_NN_BACKEND=cuda ./tests/test_nn_ops
    run_tap two_peers 120 sh "$SRC/tests/gpu/two_peers.sh"
    run_tap elastic_catchup 90 sh "$SRC/tests/gpu/elastic_catchup.sh"
    grep -h '^# cuda:' "$LOGS"/test_nn_cuda.tap 2> /dev/null | head -n 1 |
        sed 's/^# /- device: /' >> "$SUM"
    note ""
    note "### Every op against the cpu backend (test_nn_cuda)"
    note ""
    note '```'
    grep -h '^ok\|^not ok\|^# .*cosine\|^# .*max' "$LOGS"/test_nn_cuda.tap \
        2> /dev/null | cut -c1-160 >> "$SUM"
    note '```'
    note ""
    ;;
esac

# ---- 4. timing -------------------------------------------------------------------
case " $PARTS " in *" timing "*)
    note "## ResNet-50 training, batch 128, img/s"
    note ""
    note "nn_time (20 steps after 5) against torch_time.py (torchvision"
    note "resnet50, channels-last, cudnn.benchmark, autocast for bf16-amp)."
    note ""
    note "| precision | meshtrain | PyTorch | ratio |"
    note "|---|---:|---:|---:|"
    have_torch=1
    for p in fp32 tf32 bf16-amp; do
        ours="" theirs="" ratio=""
        t=$(budget 60)
        if [ "$t" -ge 20 ]; then
            ours=$(cd "$BUILD" && timeout "$t" ./tests/gpu/nn_time -d cuda \
                -p "$p" -b 128 -s 20 -w 5 2>> "$LOGS/nn_time.err" |
                tee -a "$LOGS/nn_time.log" |
                sed -n 's/.*img_s=\([0-9.]*\).*/\1/p')
            [ -n "$ours" ] || STATUS=1
        fi
        t=$(budget 60)
        if [ $have_torch -eq 1 ] && [ "$t" -ge 20 ]; then
            theirs=$(LD_LIBRARY_PATH=$ORIG_LDLP timeout "$t" "$PYTHON" \
                "$SRC/tests/gpu/torch_time.py" "$p" 128 20 5 \
                2>> "$LOGS/torch_time.err" | tee -a "$LOGS/torch_time.log" |
                sed -n 's/.*img_s=\([0-9.]*\).*/\1/p')
            if [ -z "$theirs" ] && ! LD_LIBRARY_PATH=$ORIG_LDLP "$PYTHON" -c \
                'import torch, torchvision
assert torch.cuda.is_available()' > /dev/null 2>&1; then
                have_torch=0
                say "no PyTorch with CUDA and torchvision: no reference"
            fi
        fi
        [ -n "$ours" ] && [ -n "$theirs" ] &&
            ratio=$(awk -v a="$ours" -v b="$theirs" \
                'BEGIN { printf "%.2f", a / b }')
        say "$p: meshtrain ${ours:-failed or not run} img/s, PyTorch ${theirs:--}"
        note "| $p | ${ours:-failed/not run} | ${theirs:--} | $ratio |"
    done
    note ""
    ;;
esac

# ---- 4b. overlap: two peers on the GPU, all-reduce hidden behind backward --
case " $PARTS " in *" overlap "*)
    note "## Two peers on one GPU: all-reduce hidden behind backward"
    note ""
    t=$(budget 75)
    if [ "$t" -lt 30 ]; then
        note "- not run: out of time"
    else
        ov=$LOGS/overlap
        mkdir -p "$ov"
        # shellcheck disable=SC2086
        (cd "$BUILD" && MESHTRAIN_LOG=warn timeout "$t" ./meshrun -np 2 \
            -H 127.0.0.1:2 -- ./meshtrain --port 29871 --device cuda \
            --model resnet50 --data synthetic:4096 --batch 32 --iters 12 \
            --no-eval --quiet --metrics "$ov/m.jsonl" \
            --timeline "$ov/t.json" --timeline-steps 12) \
            > "$ov/log" 2>&1
        rc=$?
        row=$("$PYTHON" "$SRC/bench/train_report.py" 2 "$ov/m.jsonl" \
            "$ov/t.json" 2> "$ov/report.err")
        if [ $rc -eq 0 ] && [ -n "$row" ]; then
            note "ResNet-50, batch 32 per peer, 224 x 224, default precision;"
            note "bench/train_report.py (steps after the first 2):"
            note ""
            note "peers,steps,t_step_s,t_compute_s,t_comm_exposed_s,t_data_s,img_per_s,allreduce_s_per_step,hidden_s_per_step,hidden_fraction"
            note "$row"
            note ""
            note "- hidden fraction $(echo "$row" | cut -d, -f10) (goal >= 0.90)"
        else
            note "- failed (exit $rc$([ $rc -eq 124 ] && echo ', timeout')):" \
                "$(grep -m 1 'nn cuda\|rror' "$ov/log" || tail -n 1 "$ov/log")"
        fi
    fi
    note ""
    ;;
esac

# ---- 5. compute-sanitizer -----------------------------------------------------------
case " $PARTS " in *" sanitize "*)
    note "## compute-sanitizer"
    note ""
    CS=$(command -v compute-sanitizer 2> /dev/null ||
        ls "$CUDA_HOME"/bin/compute-sanitizer \
            "$CUDA_HOME"/compute-sanitizer/compute-sanitizer 2> /dev/null |
        head -n 1)
    if [ -z "$CS" ]; then
        note "- not run: no compute-sanitizer on PATH or in $CUDA_HOME"
    else
        note "| tool | target | errors |"
        note "|---|---|---:|"
        for tool in memcheck synccheck racecheck; do
            for target in ops step; do
                log=$LOGS/sanitize-$tool-$target.log
                t=$(budget 45)
                if [ "$t" -lt 15 ]; then
                    note "| $tool | $target | not run: out of time |"
                    continue
                fi
                if [ $target = ops ]; then
                    set -- env NVIDIA_TF32_OVERRIDE=0 \
                        MESHTRAIN_NN_BACKEND=cuda ./tests/test_nn_ops
                else
                    set -- ./tests/gpu/nn_time -d cuda -p tf32 -a resnet18 \
                        -b 8 -i 64 -s 1 -w 0
                fi
                (cd "$BUILD" && top_srcdir=$SRC top_builddir=$BUILD \
                    timeout "$t" "$CS" --tool "$tool" --print-limit 50 \
                    "$@") > "$log" 2>&1
                rc=$?
                errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' \
                    "$log" | tail -n 1)
                if [ -z "$errs" ]; then
                    errs="no summary (exit $rc$([ $rc -eq 124 ] &&
                        echo ', timeout'))"
                elif [ "$errs" -gt 0 ]; then
                    STATUS=1
                fi
                say "compute-sanitizer $tool $target: $errs"
                note "| $tool | $target | $errs |"
            done
        done
    fi
    note ""
    ;;
esac

finish $STATUS
