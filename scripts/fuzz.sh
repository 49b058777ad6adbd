#!/bin/sh
# Run a hostile-input harness (tests/fuzz_NAME.c, see tests/fuzz.h) under
# clang's libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh NAME [SECONDS] [libFuzzer flags...]
#
# DIR=build-fuzz/ in the source tree (FUZZ_DIR overrides) receives a copy
# of the tracked and untracked-but-not-ignored files, built there with
# clang and the sanitizers (-fsanitize=fuzzer-no-link), so the main build
# is left alone. The run starts from the harness's cases
# (tests/fuzz-corpus/NAME.txt) and keeps what it finds in DIR/corpus-NAME;
# a crash, leak or timeout is saved as DIR/crash-NAME/* and the script
# fails. Replay one with DIR/src-tree/tests/fuzz_NAME FILE (the same
# harness with the replay's main), then add it to NAME.txt with the
# message it must give once fixed. One job (-jobs=1): the harness runs
# in one process, SECONDS (default 120) of wall time.
set -eu
[ $# -ge 1 ] || { sed -n '2,16s/^# \{0,1\}//p' "$0" >&2; exit 2; }
name=$1
secs=${2:-120}
shift $(($# < 2 ? $# : 2))
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${FUZZ_DIR:-$top/build-fuzz}
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac
cc=${FUZZ_CC:-clang}
[ -f "$top/tests/fuzz_$name.c" ] || {
    echo "fuzz: no harness tests/fuzz_$name.c" >&2
    exit 2
}
command -v "$cc" >/dev/null || {
    echo "fuzz: $cc not found (libFuzzer needs clang)" >&2
    exit 2
}

# The copy is refreshed over the last one (make rebuilds what changed);
# FUZZ_FRESH=1 starts from an empty one.
[ "${FUZZ_FRESH:-0}" = 1 ] && rm -rf "$dir/src-tree"
mkdir -p "$dir/src-tree"
(cd "$top" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 tar cf - --no-recursion) | (cd "$dir/src-tree" && tar xf -)
cd "$dir/src-tree"
san="-fsanitize=address,undefined -fno-sanitize-recover=all"
flags="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $san"
[ -f Makefile ] || {
    ./autogen.sh >/dev/null 2>&1 || {
        echo "fuzz: autogen.sh failed" >&2
        exit 1
    }
    ./configure CC="$cc" --without-cuda CFLAGS="$flags" LDFLAGS="$san" \
        >"$dir/configure.log" 2>&1 || {
        tail -n 30 "$dir/configure.log" >&2
        echo "fuzz: configure failed; see $dir/configure.log" >&2
        rm -f Makefile
        exit 1
    }
}
# The library's objects: what clang compiles of it (an older clang refuses
# some of collective/'s builtins, which no parser uses; -k goes on).
make -k -j2 libmesh.a >"$dir/build.log" 2>&1 || true
objs=$(find common mesh transport collective train data nn -name '*.o')
ar rcs libfuzzmesh.a $objs
libs=$(printf 'fuzz-libs:\n\t@echo $(MESH_LIBS) $(LIBS)\n' |
    make -s -f Makefile -f - fuzz-libs | sed 's/libmesh\.a/libfuzzmesh.a/')
# The replay (for the seeds, and to replay a crash), then the fuzzer.
for main in replay fuzzer; do
    if [ $main = replay ]; then
        out=tests/fuzz_$name
        extra=
    else
        out=$dir/fuzz_$name
        extra="-DFUZZ_LIBFUZZER -fsanitize=fuzzer"
    fi
    # shellcheck disable=SC2086
    $cc -std=gnu11 $flags $extra -I. -o "$out" "tests/fuzz_$name.c" \
        tests/fuzz_main.c tests/tmpdir.c $libs -lm >>"$dir/build.log" 2>&1 ||
        break
done || true
[ -x "$dir/fuzz_$name" ] || {
    tail -n 20 "$dir/build.log" >&2
    echo "fuzz: linking the libFuzzer harness failed; see $dir/build.log" >&2
    exit 1
}
mkdir -p "$dir/corpus-$name" "$dir/seeds-$name" "$dir/crash-$name"
srcdir=. "tests/fuzz_$name" --seeds "$dir/seeds-$name"
echo "fuzz: $name for $secs s (corpus $dir/corpus-$name)"
MESHTRAIN_LOG=error ASAN_OPTIONS=detect_leaks=1 \
    "$dir/fuzz_$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/crash-$name/" "$@" \
    "$dir/corpus-$name" "$dir/seeds-$name"
