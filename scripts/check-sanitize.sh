#!/bin/sh
# An AddressSanitizer + UndefinedBehaviorSanitizer build of meshtrain, and
# its unit tests run under it; CI runs this after `make check`, so a use
# after free, an overflow, a leak or undefined behaviour fails CI.
#
#   scripts/check-sanitize.sh [DIR]
#
# DIR (default build-sanitize/ in the source tree) receives a copy of the
# tracked and untracked-but-not-ignored files, configured there with the
# sanitizers and without CUDA (nothing here runs a GPU), so the main build
# is left alone. Every sanitizer report is fatal (-fno-sanitize-recover,
# halt_on_error), and LeakSanitizer reports leaks at exit.
#
# A blind spot: glibc's own reads are not instrumented, and ASan's printf
# interceptor does not check a "%.*s" argument, so the exact form of issue
# #30's defect 4 (snprintf "%.*s" from a pointer into an array that
# add_tensor had just moved) passes here; the same stale pointer read by
# strlen or by our code is caught (checked by putting the old code back).
#
# Environment: SANITIZE_TESTS overrides the list of tests to run (make
# check's TESTS); SANITIZE_FLAGS the compiler flags; SANITIZE_JOBS make's -j.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$top/build-sanitize}
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac

# The unit tests, the hostile-input harnesses' replays (tests/fuzz.h), and
# the programs' model walk (tests/train_help.sh):
# the multi-process scenarios are left to the plain build, since under ASan
# they are slow and test timing, not memory.
tests=${SANITIZE_TESTS:-"tests/test_util tests/test_reduce tests/test_hostfile
    tests/test_data tests/test_ckpt tests/test_safetensors tests/test_simulate
    tests/test_nn_ops tests/test_nn_bf16 tests/test_nn_devsim
    tests/test_transport tests/test_tcp_handshake tests/test_collective
    tests/test_sparse tests/test_finetune
    tests/fuzz_hostfile tests/fuzz_handshake tests/fuzz_frames
    tests/fuzz_ckpt tests/fuzz_data tests/fuzz_verbs
    tests/train_help.sh"}
flags=${SANITIZE_FLAGS:-"-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"}

mkdir -p "$dir"
[ -d "$top/.git" ] || [ -f "$top/.git" ] || {
    echo "check-sanitize: $top is not a git checkout; the copy takes git's list of files" >&2
    exit 1
}
# A fresh copy each time: files deleted in the tree must not linger.
rm -rf "$dir/src-tree"
mkdir "$dir/src-tree"
(cd "$top" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 tar cf - --no-recursion) | (cd "$dir/src-tree" && tar xf -)
cd "$dir/src-tree"
./autogen.sh >/dev/null 2>&1 || { echo "check-sanitize: autogen.sh failed" >&2; exit 1; }
./configure --enable-werror --without-cuda CFLAGS="$flags" \
    LDFLAGS="-fsanitize=address,undefined" >"$dir/configure.log" 2>&1 || {
    tail -n 30 "$dir/configure.log" >&2
    echo "check-sanitize: configure failed; see $dir/configure.log" >&2
    exit 1
}
jobs=${SANITIZE_JOBS:-$(nproc 2>/dev/null || echo 2)}
make -j"$jobs" >"$dir/build.log" 2>&1 || {
    tail -n 40 "$dir/build.log" >&2
    echo "check-sanitize: the sanitizer build failed; see $dir/build.log" >&2
    exit 1
}
# detect_leaks: LeakSanitizer at exit (it needs no suppressions today).
ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_printf=1:exitcode=99"
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ASAN_OPTIONS UBSAN_OPTIONS
# shellcheck disable=SC2086
if ! make -j"$jobs" check TESTS="$(echo $tests)"; then
    for f in $(find tests -name '*.log' -exec grep -l -E '^(FAIL|ERROR)' {} + 2>/dev/null); do
        echo "==== $f"
        cat "$f"
    done
    exit 1
fi
echo "check-sanitize: the sanitizer build passed: $(echo $tests)"
