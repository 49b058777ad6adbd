#!/bin/sh
# tests/cuda_module.sh: the cuda backend is a module (meshtrain-cuda.so,
# nn/cuda/include.am) that only --device cuda opens. The programs link
# no CUDA library; a cpu run maps none, read from /proc/PID/maps of a
# meshtrain that is training; --device cuda loads the module and, with no
# GPU, says there is none; a module that is missing is named in the error,
# whether MESHTRAIN_CUDA_MODULE names it or it is looked for next to the
# program; the module needs from the program only what the program
# exports to it (nn/cuda/host.sym). A TAP skip in a build without CUDA.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

B=${top_builddir:-$top_srcdir}
grep -q '^#define HAVE_CUDA 1' "$B/config.h" 2> /dev/null ||
    t_skip_all "built without CUDA (configure --with-cuda)"
MOD=$B/meshtrain-cuda.so
[ -f "$MOD" ] || t_skip_all "no $MOD: run make first"
unset MESHTRAIN_CUDA_MODULE
CUDA_LIBS='libcublas|libcublasLt|libcudnn|libcudart|meshtrain-cuda\.so'

t_plan 8

# 1. no CUDA library among the program's own dependencies
if command -v readelf > /dev/null 2>&1; then
    readelf -d "$MESHTRAIN" > "$TMP/dyn" 2>&1
    ! grep NEEDED "$TMP/dyn" | grep -Eq "$CUDA_LIBS"
    t_ok $? "meshtrain needs no CUDA library ($(grep NEEDED "$TMP/dyn" |
        grep -Eo "$CUDA_LIBS" | tr '\n' ' '))"
else
    t_skip "no readelf"
fi

# 2. a cpu run, between its steps: nothing of CUDA in its maps
take_ports 1
# shellcheck disable=SC2086
bg "$MESHTRAIN" -H localhost:1 --port "$PORT" --insecure $SMALL \
    --device cpu --data synthetic:64 --batch 2 --iters 100000 --no-eval \
    --metrics "$TMP/cpu.metrics" > "$TMP/cpu.log" 2>&1
CPU_PID=$BG_PID
if at_step cpu 2 && cp "/proc/$CPU_PID/maps" "$TMP/maps" 2> /dev/null; then
    ! grep -Eq "$CUDA_LIBS" "$TMP/maps"
    t_ok $? "a cpu run at step 2 maps no CUDA library ($(grep -Eo \
        "$CUDA_LIBS" "$TMP/maps" | sort -u | tr '\n' ' '))"
else
    t_ok 1 "a cpu run reached step 2 (maps not read)"
    t_show "$TMP/cpu.log"
fi
kill "$CPU_PID" 2> /dev/null
wait_exit "$CPU_PID" 30

# 3. --device cuda loads the module: without a GPU, the module's own error
if [ -e /dev/nvidiactl ] || nvidia-smi -L > /dev/null 2>&1; then
    t_skip "a GPU is here: tests/test_nn_cuda runs on it"
else
    "$MESHTRAIN" --device cuda --summary > "$TMP/nodev.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && grep -q "nn cuda: no CUDA device" "$TMP/nodev.log"
    t_ok $? "--device cuda, no GPU: the module loads and says so (exit $rc: $(tail -n 1 "$TMP/nodev.log"))"
fi

# 4. MESHTRAIN_CUDA_MODULE names a file that is not there
MESHTRAIN_CUDA_MODULE=$TMP/none/meshtrain-cuda.so "$MESHTRAIN" \
    --device cuda --summary > "$TMP/env.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q -- "--device cuda: cannot load $TMP/none/meshtrain-cuda.so: " \
    "$TMP/env.log"
t_ok $? "a missing MESHTRAIN_CUDA_MODULE is named (exit $rc: $(tail -n 1 "$TMP/env.log"))"

# 5, 6. a program with no module next to it names that place; one with
# the module next to it loads it (the build tree's and a relocated
# install's case); the cpu path does not care either way
mkdir -p "$TMP/bin"
cp "$MESHTRAIN" "$TMP/bin/meshtrain"
"$TMP/bin/meshtrain" --device cuda --summary > "$TMP/alone.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "$TMP/bin/meshtrain-cuda.so" "$TMP/alone.log" &&
    "$TMP/bin/meshtrain" --device cpu --summary > /dev/null 2>&1
t_ok $? "no module next to the program: the error names where it looked (exit $rc: $(tail -n 1 "$TMP/alone.log"))"
cp "$MOD" "$TMP/bin/"
"$TMP/bin/meshtrain" --device cuda --summary > "$TMP/next.log" 2>&1
! grep -q "cannot load" "$TMP/next.log"
t_ok $? "the module next to the program is found ($(tail -n 1 \
    "$TMP/next.log"))"

# 7. a module that is not one: refused with the reason, not called
cp "$MESHTRAIN" "$TMP/bin/meshtrain-cuda.so"
"$TMP/bin/meshtrain" --device cuda --summary > "$TMP/bad.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "cannot load $TMP/bin/meshtrain-cuda.so" \
    "$TMP/bad.log"
t_ok $? "a file that is no module is refused (exit $rc: $(tail -n 1 \
    "$TMP/bad.log"))"

# 8. what the module takes from the program, the program exports
if command -v nm > /dev/null 2>&1; then
    nm -D --undefined-only "$MOD" | awk '$2 ~ /^mesh_/ { print $2 }' |
        sort > "$TMP/need"
    nm -D --defined-only "$MESHTRAIN" | awk '{ print $3 }' | sort > "$TMP/have"
    missing=$(comm -23 "$TMP/need" "$TMP/have" | tr '\n' ' ')
    [ -s "$TMP/need" ] && [ -z "$missing" ]
    t_ok $? "meshtrain exports the $(wc -l < "$TMP/need") symbols the module calls${missing:+ (missing: $missing)}"
else
    t_skip "no nm"
fi
t_done
