#!/bin/sh
# tests/nn_valgrind.sh: the model walk of every ResNet under valgrind's
# memcheck, which sees what the sanitizer build cannot: reads made inside
# glibc. Issue #30's defect 4 was such a read: def_bn_buffers kept a
# pointer into the tensor table and snprintf("%.*s") read the name through
# it after add_tensor had moved the table (3 invalid reads for resnet18
# under valgrind before the fix, none after). A TAP skip without valgrind.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v valgrind > /dev/null 2>&1 || t_skip_all "valgrind is not installed"
set -- resnet18 resnet34
t_plan $#
for m in "$@"; do
    valgrind -q --error-exitcode=99 \
        --suppressions="$top_srcdir/tests/valgrind.supp" \
        "$MESHTRAIN" --summary --model "$m" --width 8 --num-classes 10 \
        > "$TMP/$m.out" 2> "$TMP/$m.vg"
    rc=$?
    n=$(grep -c "== Invalid\|== Conditional\|== Use of uninit" "$TMP/$m.vg")
    [ $rc -eq 0 ] && [ "$n" -eq 0 ] && grep -q "^parameters: " "$TMP/$m.out"
    t_ok $? "$m: the model walk is clean under memcheck ($n errors, exit $rc)"
    [ $rc -eq 0 ] || head -n 30 "$TMP/$m.vg" | sed 's/^/# /'
done
t_done
