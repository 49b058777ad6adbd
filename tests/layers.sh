#!/bin/sh
# tests/layers.sh: the folders' include graph follows the layers of
# DESIGN.md ("nothing below calls up"). For each library folder, the
# folders its sources may include:
#
#   common       (none: the base layer)
#   transport    common
#   collective   common transport
#   nn           common
#   mesh         common transport
#   data         common
#   train        common transport collective nn mesh data
#   src          every folder above (the programs)
#
# Every #include "folder/..." of a .c, .h or .cu file is checked; an
# include outside its folder's list is an upward (or sideways) dependency
# and fails, naming the file, its line and the include. Also: every source
# folder has one include.am that declares its own sources.
top_srcdir=${top_srcdir:-$(dirname "$0")/..}
cd "$top_srcdir" || exit 1

allowed() {
    case $1 in
    common) echo "" ;;
    transport) echo "common" ;;
    collective) echo "common transport" ;;
    nn) echo "common" ;;
    mesh) echo "common transport" ;;
    data) echo "common" ;;
    train) echo "common transport collective nn mesh data" ;;
    src) echo "common transport collective nn mesh data train" ;;
    esac
}

FOLDERS="common transport collective nn mesh data train src"
echo "1..$(($(echo "$FOLDERS" | wc -w) * 2))"
n=0
for d in $FOLDERS; do
    ok=$(allowed "$d")
    bad=$(find "$d" -name '*.[ch]' -o -name '*.cu' | sort |
        xargs grep -n '^#include "[a-z_]*/' 2>/dev/null |
        while IFS= read -r line; do
            inc=$(printf '%s\n' "$line" | sed 's/.*#include "\([a-z_]*\)\/.*/\1/')
            [ "$inc" = "$d" ] && continue
            case " $ok " in *" $inc "*) continue ;; esac
            printf '%s\n' "$line"
        done)
    n=$((n + 1))
    if [ -z "$bad" ]; then
        echo "ok $n - $d/ includes only: ${ok:-nothing above it}"
    else
        echo "not ok $n - $d/ includes outside its layer (${ok:-none} allowed):"
        printf '%s\n' "$bad" | sed 's/^/#   /'
    fi
    n=$((n + 1))
    srcs=$(find "$d" -name '*.c' | sort)
    missing=""
    for f in $srcs; do
        # shellcheck disable=SC2046
        grep -qs "$f" $(find "$d" -name include.am) ||
            missing="$missing $f"
    done
    if [ -f "$d/include.am" ] && [ -z "$missing" ]; then
        echo "ok $n - $d/include.am declares every source of $d/"
    else
        echo "not ok $n - $d/include.am is missing or does not declare:$missing"
    fi
done
