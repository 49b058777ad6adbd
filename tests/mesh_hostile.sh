#!/bin/sh
# tests/mesh_hostile.sh: a peer that passed the handshake (it holds the
# secret) sends a hostile frame: the test aid MESHTRAIN_TEST_WIRE=KIND:N
# changes the header of the N-th data frame it sends (transport/base.h).
# Over tcp and shm, for frames that are checked on arrival (a desync of
# op, dtype or count; a length past the receive, by one byte, 64 KiB or
# 2^62; a broken frame header; a ring slot neither inline nor by address,
# or longer than a slot): every rank exits non-zero, none killed by a
# signal, none left running, and every survivor's log names the hostile
# rank and the fault.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

CASES="tcp:op tcp:dtype tcp:count tcp:length tcp:long tcp:huge tcp:magic \
shm:op shm:count shm:length shm:long shm:huge shm:kind"
t_plan 13
BENCH="--op allreduce --algo ring -b 64K -e 1M -f 4 -n 2 -w 1 --streams 1"

i=0
for c in $CASES; do
    tr=${c%%:*}
    kind=${c#*:}
    evil=$((i % 3))
    # shm's first frames go over its TCP mesh (the join's exchange):
    # from the 10th on, they are the ring's
    nth=$((2 + i % 5))
    [ "$tr" = shm ] && nth=$((nth + 10))
    i=$((i + 1))
    take_ports 3 || { t_skip "no free ports"; continue; }
    make_secret "$TMP/secret"
    PEERS=""
    for r in 0 1 2; do
        w=""
        [ $r -eq $evil ] && w="$kind:$nth"
        # shellcheck disable=SC2086
        bg env MESHTRAIN_TEST_WIRE="$w" MESHTRAIN_SHM_CMA=0 "$MESHBENCH" \
            -H localhost:3 --rank $r --port "$PORT" --transport "$tr" \
            --secret-file "$TMP/secret" $BENCH > "$TMP/$i.$r.log" 2>&1
        PEERS="$PEERS $BG_PID"
    done
    codes=""
    for p in $PEERS; do
        wait_exit "$p" 120
        codes="$codes $EXIT_CODE"
    done
    case $kind in
    op | dtype | count) fault="desync" ;;
    kind) fault="garbage on its ring" ;;
    magic) fault="garbage on data stream" ;;
    long) fault="beyond the posted receive\|garbage on its ring" ;;
    *) fault="beyond the posted receive" ;;
    esac
    name="rank $evil (localhost:$((PORT + evil)))"
    bad=""
    for r in 0 1 2; do
        set -- $codes
        shift $r
        case $1 in 0 | 255 | 1[3-9][0-9] | 2[0-5][0-9]) bad="$bad $r" ;; esac
        [ $r -eq $evil ] && continue
        grep "$name" "$TMP/$i.$r.log" | grep -q "$fault" || bad="$bad $r"
    done
    grep -q "test aid: a hostile frame ($kind)" "$TMP/$i.$evil.log" ||
        bad="$bad $evil"
    t_ok "$([ -z "$bad" ]; echo $?)" \
        "$tr, rank $evil's frame $nth with a hostile $kind: every rank \
fails, naming it and the fault (exit codes$codes)"
    for r in $bad; do
        t_diag "rank $r:"
        t_show "$TMP/$i.$r.log" 4
    done
done
t_done
