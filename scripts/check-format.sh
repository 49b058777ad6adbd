#!/bin/sh
# scripts/check-format.sh: every C, header and CUDA source is formatted as
# .clang-format says (clang-format 14, Debian 12's). .ci/run calls it; a
# difference fails CI, listing the files. `make format` rewrites them.
#   scripts/check-format.sh          check (exit 1 on any difference)
#   scripts/check-format.sh --fix    format in place
set -e
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null 2>&1 || {
    echo "check-format: clang-format not found (apt-get install clang-format)" >&2
    exit 2
}
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files '*.c' '*.h' '*.cu')
else
    files=$(find . -path ./build-sanitize -prune -o \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print |
        grep -v -e '^\./config\.h$')
fi
if [ "$1" = "--fix" ]; then
    # shellcheck disable=SC2086
    clang-format -i $files
    exit 0
fi
bad=""
for f in $files; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
done
if [ -n "$bad" ]; then
    echo "check-format: not formatted as .clang-format says (run make format):" >&2
    for f in $bad; do echo "  $f" >&2; done
    exit 1
fi
echo "check-format: $(echo "$files" | wc -w) files, 0 differences"
