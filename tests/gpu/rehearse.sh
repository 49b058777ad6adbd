#!/bin/sh
# tests/gpu/rehearse.sh: tests/gpu/run.sh as far as a machine without a GPU
# can take it, in a clean Debian tree that stands in for a CUDA image: a
# debootstrap'ed bookworm (minbase with gcc, g++, python3 and numpy only:
# no libevent, OpenSSL, oneDNN or zlib dev files, no pkg-config, no make),
# this machine's CUDA toolkit bind-mounted read-only at /usr/local/cuda,
# the bundle and run.sh copied in. It shows that the bundle unpacks into
# its private prefix, that configure enables CUDA and oneDNN, that the
# build succeeds, and that every required test reaches the point where it
# needs a GPU ("no CUDA device"). Needs root (debootstrap, chroot, mount);
# not part of make check (it takes minutes). tests/gpu/REHEARSAL.md keeps
# the evidence of the last run.
#
# usage: tests/gpu/rehearse.sh BUNDLE [ROOT]
#   ROOT defaults to /var/tmp/meshtrain-rehearse (made by debootstrap,
#   installed with apt-get, when absent; reused after).
# Exit status: 0 when everything reached "no CUDA device", else 1.
set -u

BUNDLE=${1:-}
ROOT=${2:-/var/tmp/meshtrain-rehearse}
here=$(cd "$(dirname "$0")" && pwd)
CUDA=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")

die() {
    echo "rehearse.sh: $*" >&2
    exit 1
}
[ -n "$BUNDLE" ] && [ -d "$BUNDLE" ] || die "usage: rehearse.sh BUNDLE [ROOT]"
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -x "$CUDA/bin/nvcc" ] || die "no CUDA toolkit at $CUDA"

if [ ! -x "$ROOT/bin/sh" ]; then
    command -v debootstrap > /dev/null 2>&1 ||
        apt-get install -y debootstrap > /dev/null || die "no debootstrap"
    debootstrap --variant=minbase \
        --include=gcc,g++,libc6-dev,python3,python3-numpy,xz-utils,procps \
        bookworm "$ROOT" http://deb.debian.org/debian > "$ROOT.log" 2>&1 ||
        die "debootstrap failed: see $ROOT.log"
fi
for p in libevent-dev libssl-dev libdnnl-dev zlib1g-dev pkgconf make; do
    if chroot "$ROOT" dpkg -s "$p" > /dev/null 2>&1; then
        die "$ROOT has $p installed: not a clean stand-in"
    fi
done

# debootstrap leaves no /etc/hosts; an image has one (localhost)
[ -f "$ROOT/etc/hosts" ] ||
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > "$ROOT/etc/hosts"
rm -rf "$ROOT/rehearse"
mkdir -p "$ROOT/rehearse/tests/gpu" "$ROOT/usr/local/cuda" || die "mkdir"
cp "$here/run.sh" "$ROOT/rehearse/tests/gpu/" || die "cannot copy run.sh"
cp -r "$BUNDLE" "$ROOT/rehearse/gpu-bundle" || die "cannot copy $BUNDLE"
umount_all() {
    umount "$ROOT/usr/local/cuda" 2> /dev/null
    umount "$ROOT/proc" 2> /dev/null
}
trap umount_all EXIT INT TERM
mount --bind "$CUDA" "$ROOT/usr/local/cuda" &&
    mount -o remount,bind,ro "$ROOT/usr/local/cuda" ||
    die "cannot bind-mount $CUDA"
mount -t proc proc "$ROOT/proc" || die "cannot mount proc"

t0=$(date +%s)
chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GPU_ARCH="${GPU_ARCH:-sm_90}" JOBS="${JOBS:-2}" GPU_DEADLINE=900 \
    /bin/sh -c 'cd /rehearse && sh tests/gpu/run.sh gpu-bundle out'
rc=$?
secs=$(($(date +%s) - t0))
umount_all
trap - EXIT INT TERM

OUTD=$ROOT/rehearse/out
echo "rehearse.sh: run.sh exited $rc after $secs s; $OUTD holds:"
ls -l "$OUTD"
ok=1
[ "$(ls "$OUTD" | wc -l)" -eq 2 ] && [ -f "$OUTD/summary.md" ] &&
    [ -f "$OUTD/gpu-logs.tar.gz" ] || {
    echo "FAIL: not exactly summary.md and gpu-logs.tar.gz"
    ok=0
}
grep -q '^- built in' "$OUTD/summary.md" || {
    echo "FAIL: no build"
    ok=0
}
mkdir -p "$ROOT/rehearse/logs" &&
    tar -xzf "$OUTD/gpu-logs.tar.gz" -C "$ROOT/rehearse" || ok=0
L=$ROOT/rehearse/logs
# compute-sanitizer comes with the toolkit of a CUDA image; this machine's
# toolkit may lack it (then run.sh says so in the summary)
SAN=""
[ -x "$CUDA/bin/compute-sanitizer" ] && SAN=sanitize-memcheck-step.log
for f in test_nn_cuda.tap test_nn_ops_cuda.tap two_peers.tap \
    elastic_catchup.tap nn_time.err overlap/log $SAN; do
    if grep -q 'no CUDA device\|no CUDA-capable device\|CUDA driver' \
        "$L/$f" 2> /dev/null; then
        echo "reached the GPU: $f: $(grep -m 1 'no CUDA\|CUDA driver' \
            "$L/$f" | cut -c1-160)"
    else
        echo "FAIL: $f does not reach 'no CUDA device'"
        ok=0
    fi
done
echo "---- summary.md"
cat "$OUTD/summary.md"
[ $ok -eq 1 ] && [ "$rc" -eq 1 ]
