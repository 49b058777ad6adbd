#!/bin/sh
# tests/train_badinput.sh: a battery of bad inputs. Every file-taking flag
# of meshtrain (and meshrun's --hostfile) gets a FIFO, a directory,
# /dev/zero, an unreadable file, a huge file and a truncated one; every
# numeric flag gets 0, a negative number, NaN and a huge number. Each run
# must end within $LIMIT seconds (a hang fails the test) with exit 1 and a
# message that names the flag or the file; so must every flag that takes a
# word (an enumeration, a name) given a value nothing accepts. The flags come from
# `meshtrain --help`, so that a new flag cannot be forgotten here.
#
# A value that is valid (0 for --seed, say) is accepted; the run then
# stops at a sentinel error that every command carries (a cifar10 folder
# that does not exist), before any training.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

LIMIT=10
take_ports 1 || exit 99
port=$PORT
SENTINEL="$TMP/no-such-data"
BASE="--insecure --port $port --join-timeout 5 --model resnet18 --width 16 \
--cifar-stem --threads 1 --data-threads 1 --quiet --iters 1 \
--data cifar10:$SENTINEL"

# run LOG CMD...: CMD under a timeout; RC gets its exit code (124: hung).
run() {
    _log=$1
    shift
    timeout -k 2 "$LIMIT" "$@" < /dev/null > "$_log" 2>&1
    RC=$?
}

# check NAME LOG PATTERN: ok when the run exited 1 and its output matches
# PATTERN (grep -E); the message is shown as a diagnostic.
check() {
    if [ "$RC" -eq 1 ] && grep -Eq -- "$3" "$2"; then
        t_ok 0 "$1"
    else
        t_ok 1 "$1 (exit $RC$([ "$RC" -eq 124 ] && echo ': hung'))"
        t_show "$2" 5
    fi
    grep -E 'meshtrain:|meshrun:' "$2" | tail -n 1 | cut -c 1-160 |
        sed 's/^/#   /'
}

# ---- the flags, from --help ------------------------------------------------

"$MESHTRAIN" --help > "$TMP/help" 2>&1 || {
    t_plan 1
    t_ok 1 "meshtrain --help"
    t_done
}
# "  --flag ARG  help" and "  -H, --hosts LIST  help"; switches have none.
sed -n -e 's/^  \(--[a-z0-9-]*\) \([^ ][^ ]*\) .*/\1 \2/p' \
    -e 's/^  -[A-Za-z], \(--[a-z0-9-]*\) \([^ ][^ ]*\) .*/\1 \2/p' \
    "$TMP/help" > "$TMP/flags"
FILE_FLAGS=""
DIR_FLAGS=""
NUM_FLAGS=""
WORD_FLAGS=""
while read -r flag arg; do
    case $arg in
    FILE | *CSV*) FILE_FLAGS="$FILE_FLAGS $flag" ;;
    DIR) DIR_FLAGS="$DIR_FLAGS $flag" ;;
    SPEC) ;; # --data: its own cases below
    NAME | LIST | ID | CC | MODE | *'|'*) WORD_FLAGS="$WORD_FLAGS $flag" ;;
    *) NUM_FLAGS="$NUM_FLAGS $flag" ;;
    esac
done < "$TMP/flags"
t_diag "file flags:$FILE_FLAGS"
t_diag "folder flags:$DIR_FLAGS"
t_diag "numeric flags:$NUM_FLAGS"
t_diag "word flags:$WORD_FLAGS"
# The battery must see the flags it knows exist, or the parsing broke.
for f in --hostfile --secret-file --metrics --save --simulate-compute; do
    case " $FILE_FLAGS " in *" $f "*) ;; *) t_diag "missing $f" ;; esac
done

# ---- bad files ---------------------------------------------------------------

ROOT=0
[ "$(id -u)" -eq 0 ] && ROOT=1
mkfifo "$TMP/fifo"
mkdir "$TMP/dir"
printf 'x\n' > "$TMP/unreadable"
chmod 000 "$TMP/unreadable"
# 8 GiB, sparse: nothing reads it whole
truncate -s 8G "$TMP/huge"

# bad_file KIND PATH: sets BAD to a file of KIND at PATH ("" to skip).
bad_file() {
    rm -rf "$2"
    case $1 in
    fifo) mkfifo "$2" ;;
    dir) mkdir "$2" ;;
    devzero) ln -s /dev/zero "$2" ;;
    unreadable) printf 'x\n' > "$2" && chmod 000 "$2" ;;
    huge) truncate -s 8G "$2" ;;
    truncated) printf '%s' "$3" > "$2" ;;
    esac
}

KINDS="fifo dir devzero unreadable huge truncated"
SENTINEL_OK=0

# file_case FLAG KIND TRUNCATED-TEXT TAIL CMD...: run CMD FLAG FILE TAIL
# with FILE a bad file of KIND (TAIL: words after it, "" for none);
# expects exit 1 naming FILE, or the sentinel where FILE is acceptable.
file_case() {
    _flag=$1
    _kind=$2
    _text=$3
    _tail=$4
    shift 4
    if [ "$_kind" = unreadable ] && [ $ROOT -eq 1 ]; then
        t_skip "$_flag $_kind: running as root, which reads any file"
        return
    fi
    _f="$TMP/bad-${_flag#--}-$_kind"
    bad_file "$_kind" "$_f" "$_text"
    # a secret must be 0600; so are these, to reach the checks behind it
    [ -f "$_f" ] && [ "$_kind" != unreadable ] && chmod 600 "$_f"
    # shellcheck disable=SC2086
    run "$TMP/out" "$@" "$_flag" "$_f" $_tail
    # the message names the file (meshrun: the path it resolves to), or
    # the run reached the sentinel where the file is acceptable
    _want="bad-${_flag#--}-$_kind|/dev/zero"
    [ "$SENTINEL_OK" = 1 ] && _want="$_want|$SENTINEL"
    check "$(basename "$1") $_flag <$_kind>" "$TMP/out" "$_want"
    rm -rf "$_f"
}

SECRET_TEXT="abc"
HOST_TEXT="localhost slots="
CSV_TEXT="layer,forward_ms,backward_ms
conv1,1.0"
for flag in $FILE_FLAGS; do
    for kind in $KINDS; do
        case $flag in
        --hostfile)
            # shellcheck disable=SC2086
            file_case "$flag" "$kind" "$HOST_TEXT" "" "$MESHTRAIN" \
                $(echo "$BASE") ;;
        --secret-file)
            # shellcheck disable=SC2086
            file_case "$flag" "$kind" "$SECRET_TEXT" "" "$MESHTRAIN" \
                -H localhost:1 $(echo "$BASE" | sed 's/--insecure//') ;;
        --simulate-compute)
            # shellcheck disable=SC2086
            file_case "$flag" "$kind" "$CSV_TEXT" "" "$MESHTRAIN" \
                -H localhost:1 $BASE ;;
        --predict-out)
            # an output that exists only with --predict, as above
            case $kind in huge | truncated) SENTINEL_OK=1 ;; esac
            mkdir -p "$TMP/predict-dir"
            # shellcheck disable=SC2086
            file_case "$flag" "$kind" "x" "--predict $TMP/predict-dir" \
                "$MESHTRAIN" -H localhost:1 $BASE
            SENTINEL_OK=0 ;;
        *)
            # outputs: an existing huge or truncated file is overwritten
            # (the run then meets the sentinel); the rest are refused
            case $kind in huge | truncated) SENTINEL_OK=1 ;; esac
            # shellcheck disable=SC2086
            file_case "$flag" "$kind" "x" "" "$MESHTRAIN" -H localhost:1 $BASE
            SENTINEL_OK=0 ;;
        esac
    done
done

# meshrun's --hostfile
for kind in $KINDS; do
    file_case --hostfile "$kind" "$HOST_TEXT" "-- true" "$MESHRUN"
done

# Folders: a FIFO, a file or a device where a folder belongs.
for flag in $DIR_FLAGS; do
    # --checkpoint-dir is used only with --checkpoint-every
    _tail=""
    [ "$flag" = --checkpoint-dir ] && _tail="--checkpoint-every 1"
    for kind in fifo devzero huge; do
        # shellcheck disable=SC2086
        file_case "$flag" "$kind" "" "$_tail" "$MESHTRAIN" -H localhost:1 \
            $BASE
    done
done

# --data: the folder itself, and a data file inside it, of every kind.
# A tiny valid Fashion-MNIST set (1 image of 1 x 1), one file replaced.
fm_set() {
    rm -rf "$1"
    mkdir -p "$1"
    for s in train t10k; do
        printf '\000\000\010\003\000\000\000\001\000\000\000\001\000\000\000\001\000' \
            > "$1/$s-images-idx3-ubyte"
        printf '\000\000\010\001\000\000\000\001\000' \
            > "$1/$s-labels-idx1-ubyte"
    done
}
for kind in $KINDS; do
    if [ "$kind" = unreadable ] && [ $ROOT -eq 1 ]; then
        t_skip "--data <$kind>: running as root, which reads any file"
        continue
    fi
    fm_set "$TMP/fm"
    bad_file "$kind" "$TMP/fm/train-images-idx3-ubyte" \
        "$(printf '\000\000\010\003\000')"
    # shellcheck disable=SC2086
    run "$TMP/out" "$MESHTRAIN" -H localhost:1 $BASE \
        --data "fashion-mnist:$TMP/fm"
    check "--data fashion-mnist: train images <$kind>" "$TMP/out" \
        "train-images-idx3-ubyte"
    mkdir -p "$TMP/cf"
    bad_file "$kind" "$TMP/cf/data_batch_1.bin" "$(printf '\001\002\003')"
    # shellcheck disable=SC2086
    run "$TMP/out" "$MESHTRAIN" -H localhost:1 $BASE --data "cifar10:$TMP/cf"
    check "--data cifar10: data_batch_1.bin <$kind>" "$TMP/out" \
        "data_batch_1.bin"
    rm -rf "$TMP/cf"
done
for spec in fashion-mnist cifar10 imagefolder; do
    for kind in fifo devzero huge; do
        bad_file "$kind" "$TMP/spec" ""
        # shellcheck disable=SC2086
        run "$TMP/out" "$MESHTRAIN" -H localhost:1 $BASE \
            --data "$spec:$TMP/spec"
        check "--data $spec:<$kind>" "$TMP/out" "$TMP/spec"
        rm -rf "$TMP/spec"
    done
done

# ---- bad numbers and words ---------------------------------------------------

# Every numeric flag: 0, negative, NaN, huge. A refusal names the flag; a
# valid value (0 for --seed, say) meets the sentinel.
for flag in $NUM_FLAGS; do
    for v in 0 -1 nan 99999999999999999999; do
        # shellcheck disable=SC2086
        run "$TMP/out" "$MESHTRAIN" -H localhost:1 $BASE "$flag" "$v"
        check "$flag $v" "$TMP/out" "$flag|$SENTINEL"
    done
done

# Every word flag: a value no one accepts, refused naming the flag (-H for
# --hosts); only names nothing here can check (an RDMA device unused by
# tcp, a job id) may meet the sentinel.
for flag in $WORD_FLAGS; do
    v="no-such-value!"
    want="$flag"
    case $flag in
    --hosts) v="::bad" want="-H" ;;
    --ib-dev) want="$flag|$SENTINEL" ;;
    --job-id) v="two words" ;;
    esac
    # shellcheck disable=SC2086
    run "$TMP/out" "$MESHTRAIN" -H localhost:1 $BASE "$flag" "$v"
    check "$flag '$v'" "$TMP/out" "$want|job id"
done

t_plan "$T_N"
t_done
