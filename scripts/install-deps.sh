#!/bin/sh
# Install everything meshtrain needs to build, test and benchmark on Debian
# or Ubuntu. Run as root (or with sudo available).
#   scripts/install-deps.sh          build + test dependencies
#   scripts/install-deps.sh --bench  also Open MPI, Gloo (PyTorch), iperf3
set -e
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
PKGS="build-essential autoconf automake libtool pkg-config
      libevent-dev libssl-dev zlib1g-dev libjpeg62-turbo-dev libdnnl-dev
      libibverbs-dev librdmacm-dev
      dataset-fashion-mnist iproute2 procps python3"
# The verbs lane (tests/verbs/lane.sh) boots Debian's kernel under QEMU with
# Soft-RoCE; it downloads linux-image-amd64 itself (apt-get download, never
# installed as this machine's kernel).
PKGS="$PKGS qemu-system-x86 busybox-static rdma-core ibverbs-utils perftest"
# Reference checks (PyTorch parity tests) run when torch is importable.
PKGS="$PKGS python3-torch python3-torchvision python3-numpy"
# tests/nn_valgrind.sh: memcheck of the model walk.
PKGS="$PKGS valgrind"
# scripts/check-format.sh (CI) and make format.
PKGS="$PKGS clang-format"
if [ "$1" = "--bench" ]; then
    PKGS="$PKGS openmpi-bin libopenmpi-dev iperf3 python3-matplotlib iputils-ping"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Ubuntu names libjpeg-turbo's dev package libjpeg-turbo8-dev.
if ! apt-cache show libjpeg62-turbo-dev >/dev/null 2>&1; then
    PKGS=$(echo "$PKGS" | sed 's/libjpeg62-turbo-dev/libjpeg-turbo8-dev/')
fi
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $PKGS
