#!/bin/sh
# tests/gpu/bundle.sh: what an offline GPU machine needs to build and test
# meshtrain, in one directory made here (`make gpu-bundle` calls it):
#   DIR/meshtrain-VERSION.tar.gz  the `make dist` tarball (no autotools
#                                 needed there);
#   DIR/debs/*.deb                the Debian packages that configure and the
#                                 GPU tests need and a CUDA image usually
#                                 lacks (libevent, OpenSSL's dev files,
#                                 oneDNN and the OpenCL loader it links,
#                                 pkgconf, zlib and libjpeg dev files,
#                                 make), fetched with `apt-get download`;
#                                 tests/gpu/run.sh unpacks them with
#                                 `dpkg-deb -x` into a private prefix,
#                                 never into /;
#   DIR/cudnn-include/            cuDNN's headers from this machine's
#                                 toolkit, used there only when neither the
#                                 toolkit nor Python's nvidia-cudnn wheel
#                                 has them;
#   DIR/MANIFEST                  what is in it, with sizes and SHA-256.
# The directory travels to the GPU machine as an untracked path (the device
# tool carries at most 64 MiB in all: the script fails above 60 MiB).
#
# usage: tests/gpu/bundle.sh TARBALL DIR
# Exit status: 0, or 1 with a message naming what failed.
set -u

PKGS="libevent-dev libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7
libevent-extra-2.1-7 libevent-openssl-2.1-7 libssl-dev libssl3
libdnnl-dev libdnnl2 ocl-icd-libopencl1 pkgconf pkgconf-bin libpkgconf3
zlib1g-dev libjpeg62-turbo-dev libjpeg62-turbo libjpeg-dev make"
LIMIT_KB=$((60 * 1024))

die() {
    echo "bundle.sh: $*" >&2
    exit 1
}

[ $# -eq 2 ] || die "usage: bundle.sh TARBALL DIR"
TARBALL=$1
DIR=$2
[ -f "$TARBALL" ] || die "no tarball $TARBALL"
command -v apt-get > /dev/null 2>&1 || die "apt-get is needed (Debian)"
command -v sha256sum > /dev/null 2>&1 || die "sha256sum is needed"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

rm -rf "$DIR" || die "cannot remove the old $DIR"
mkdir -p "$DIR/debs" "$DIR/cudnn-include" || die "cannot create $DIR"
cp "$TARBALL" "$DIR/" || die "cannot copy $TARBALL into $DIR"

# apt-get download writes into the current directory, as the user that
# runs it (no root needed); the versions are this machine's candidates.
# shellcheck disable=SC2086
(cd "$DIR/debs" && apt-get download $PKGS) > "$DIR/apt.log" 2>&1 || {
    cat "$DIR/apt.log" >&2
    die "apt-get download failed (see above); run apt-get update?"
}
rm -f "$DIR/apt.log"
for p in $PKGS; do
    ls "$DIR/debs/${p}_"*.deb > /dev/null 2>&1 || die "no .deb of $p"
done

if ls "$CUDA_HOME"/include/cudnn*.h > /dev/null 2>&1; then
    cp "$CUDA_HOME"/include/cudnn*.h "$DIR/cudnn-include/" ||
        die "cannot copy cuDNN's headers"
else
    echo "bundle.sh: no cuDNN headers in $CUDA_HOME/include: the GPU" \
        "machine must have its own" >&2
fi

{
    echo "# meshtrain GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# on $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
    (cd "$DIR" && find . -type f ! -name MANIFEST | sort |
        while read -r f; do
            echo "$(sha256sum < "$f" | cut -c1-64) $(wc -c < "$f") $f"
        done)
} > "$DIR/MANIFEST" || die "cannot write the manifest"

kb=$(du -sk "$DIR" | cut -f1)
[ "$kb" -le $LIMIT_KB ] ||
    die "$DIR is $kb KiB, over the $LIMIT_KB KiB the device tool carries"
echo "bundle.sh: $DIR: $(ls "$DIR/debs" | wc -l) packages," \
    "$(basename "$TARBALL"), $kb KiB"
