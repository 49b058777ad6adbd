#!/bin/sh
# tests/mesh_hostile.sh: a peer that passed the handshake (it holds the
# secret) sends a hostile frame: the test aid MESHTRAIN_TEST_WIRE=KIND:N
# changes the header of the N-th data frame it sends (transport/base.h).
# Over tcp and shm, for frames that are checked on arrival (a desync of
# op, dtype or count; a length past the receive, by one byte, 64 KiB or
# 2^62; a broken frame header; a ring slot neither inline nor by address,
# or longer than a slot) and for frames that no receive will ever match
# (a seq 2^32 collectives ahead, the collective before's seq, a
# duplicate, an offset past the collective; inside the collective running
# there, another step, or an offset past its message; a seq 2 ahead, with
# frames of the running one due behind it on its one stream or ring):
# every rank exits non-zero, none killed by a signal, none left running,
# and every survivor's log names the hostile rank and the fault. ahead4:
# the frame 2 collectives ahead on one of 4 tcp streams, the frames due
# behind it never sent: the parked stream waits for them on the other
# streams, until twice the peer timeout without a byte on any of them.
# measure4: likewise, a ping of the links' measure at the communicator's
# forming (point-to-point frames, checked against the measure's expected
# receives like a collective's) sent 2 seqs ahead. stale4: that ping sent
# with the seq before the measure's, of no collective: no receive takes it
# while the receives of the pings behind it wait, until twice the peer
# timeout without a byte on any of the 4 streams. shm:stale4: that ping
# on a ring (its 13th data frame): no receive takes it while the
# receives of the pings behind it wait, until twice the peer timeout
# without a slot published or taken on the ring.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

CASES="tcp:op tcp:dtype tcp:count tcp:length tcp:long tcp:huge tcp:magic \
shm:op shm:count shm:length shm:long shm:huge shm:kind \
tcp:seq tcp:stale tcp:dup tcp:offset shm:seq shm:stale shm:dup shm:offset \
tcp:tag shm:tag tcp:inside shm:inside tcp:ahead shm:ahead tcp:ahead4 \
tcp:measure4 tcp:stale4 shm:stale4"
t_plan 31

i=0
for c in $CASES; do
    tr=${c%%:*}
    kind=${c#*:}
    evil=$((i % 3))
    # shm's first frames go over its TCP mesh (the join's exchange):
    # from the 10th on, they are the ring's
    nth=$((2 + i % 5))
    [ "$tr" = shm ] && nth=$((nth + 10))
    BENCH="--op allreduce --algo ring -b 64K -e 1M -f 4 -n 2 -w 1 --streams 1"
    case $kind in
    # past the collective's first: the seq before it is not a
    # collective's (the links' measure: 20 pings of seq 1, then 4 streams)
    stale) nth=$((nth + 20)) ;;
    dup) nth=$((nth + 10)) ;;
    # past the links' measure, inside a collective, on one of 4 streams
    ahead4)
        nth=40
        BENCH="${BENCH% --streams 1} --streams 4 --peer-timeout 5"
        ;;
    # the 4th of the links' measure's 20 pings
    measure4 | stale4)
        nth=4
        [ "$tr" = shm ] && nth=13
        BENCH="${BENCH% --streams 1} --streams 4 --peer-timeout 5"
        ;;
    # one message the whole collective: the offset lands past it
    offset) BENCH="--op allreduce --algo direct -b 1K -e 1K -n 2 -w 1" ;;
    esac
    wire=${kind%4}
    [ "$kind" = measure4 ] && wire=ahead
    i=$((i + 1))
    take_ports 3 || { t_skip "no free ports"; continue; }
    make_secret "$TMP/secret"
    PEERS=""
    for r in 0 1 2; do
        w=""
        [ $r -eq $evil ] && w="$wire:$nth"
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
    # a length past the collective's own count fails as such first
    long) fault="beyond the posted receive\|garbage on its ring\|past its own" ;;
    seq) fault="too far ahead" ;;
    offset) fault="past its own collective" ;;
    # a receive of its collective that is not posted yet may still take
    # it, but none has that step, or that offset
    tag | inside) fault="no receive of its collective here expects" ;;
    ahead | ahead4 | measure4)
        fault="ahead of frames of the one running here"
        ;;
    stale4) fault="that no receive posted here takes" ;;
    # it may still meet a receive of the collective before, not finished
    # here yet (a receive done: a duplicate; its count differs; its bytes
    # claimed)
    stale) fault="finished here\|duplicate\|desync\|beyond the posted receive" ;;
    dup) fault="duplicate\|finished here\|beyond the posted receive" ;;
    *) fault="beyond the posted receive\|past its own collective" ;;
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
    grep -q "test aid: a hostile frame ($wire)" "$TMP/$i.$evil.log" ||
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
