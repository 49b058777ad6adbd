#!/bin/sh
# tests/train_help.sh: every flag of meshtrain --help (its own and the
# mesh flags) is documented in man/meshtrain.1; bad flags exit 1 with a
# message naming them; --summary works without a mesh.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 4
"$MESHTRAIN" --help > "$TMP/help" 2>&1
t_ok $? "--help exits 0"
missing=""
for f in $(grep -o '^ *--[a-z0-9-]*' "$TMP/help" | tr -d ' ' | sort -u); do
    m=$(printf '%s' "$f" | sed 's/-/\\\\-/g')
    grep -q -- "$m" "$top_srcdir/man/meshtrain.1" || missing="$missing $f"
done
[ -z "$missing" ]
t_ok $? "every --help flag is in man/meshtrain.1${missing:+ (missing:$missing)}"
"$MESHTRAIN" --batch zero > "$TMP/bad" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q -- "--batch" "$TMP/bad"
t_ok $? "a bad value exits 1 naming the flag (exit $rc)"
"$MESHTRAIN" --model resnet18 --width 16 --image-size 28 --in-channels 1 \
    --num-classes 10 --cifar-stem --summary > "$TMP/sum" 2>&1 &&
    grep -q "^parameters: " "$TMP/sum"
t_ok $? "--summary prints the layer table"
t_done
