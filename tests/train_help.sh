#!/bin/sh
# tests/train_help.sh: every flag of meshtrain --help (its own and the
# mesh flags) is documented in man/meshtrain.1; bad flags exit 1 with a
# message naming them; --summary works without a mesh, and walks every
# model of the family to torchvision's parameter counts (under
# scripts/check-sanitize.sh this is the model walk that ASan checks).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 10
"$MESHTRAIN" --help > "$TMP/help" 2>&1
t_ok $? "--help exits 0"
missing=""
for f in $(grep -o '^ *--[a-z0-9-]*' "$TMP/help" | tr -d ' ' | sort -u); do
    m=$(printf '%s' "$f" | sed 's/-/\\\\-/g')
    grep -q -- "$m" "$top_srcdir/man/meshtrain.1" || missing="$missing $f"
done
[ -z "$missing" ]
t_ok $? "every --help flag is in man/meshtrain.1${missing:+ (missing:$missing)}"
# Each flag's argument whole: --algo names every algorithm it takes.
algos="ring|tree|direct|rd|rhd|hier|htree|hrd|local|auto|ps"
grep -q -- "--algo $algos " "$TMP/help"
t_ok $? "--help names every --algo value ($algos)"
"$MESHTRAIN" --batch zero > "$TMP/bad" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q -- "--batch" "$TMP/bad"
t_ok $? "a bad value exits 1 naming the flag (exit $rc)"
"$MESHTRAIN" --model resnet18 --width 16 --image-size 28 --in-channels 1 \
    --num-classes 10 --cifar-stem --summary > "$TMP/sum" 2>&1 &&
    grep -q "^parameters: " "$TMP/sum"
t_ok $? "--summary prints the layer table"
# torchvision's parameter counts (sum of numel over model.parameters()).
for mp in resnet18:11689512 resnet34:21797672 resnet50:25557032 \
          resnet101:44549160 resnet152:60192808; do
    m=${mp%%:*}
    want=${mp#*:}
    "$MESHTRAIN" --model "$m" --num-classes 1000 --summary > "$TMP/sum.$m" 2>&1
    rc=$?
    got=$(sed -n 's/^parameters: //p' "$TMP/sum.$m")
    [ $rc -eq 0 ] && [ "$got" = "$want" ]
    t_ok $? "--summary --model $m: $got parameters, torchvision's $want (exit $rc)"
done
t_done
