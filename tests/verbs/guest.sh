#!/bin/sh
# tests/verbs/guest.sh BUILDDIR SRCDIR: the verbs lane's job, run inside the
# QEMU guest (chrooted into the host's read-only root, /tmp a tmpfs) by
# tests/verbs/lane.sh. Prints "VERBS-TAP ok|not ok|skip - what" and
# "VERBS-TAP # diag" lines on the console; the lane turns them into TAP.
B=$1
S=$2
. "$S/tests/verbs/guest-lib.sh"
export MESHTRAIN_TEST_SLOW=${MESHTRAIN_TEST_SLOW:-4}
: "${VERBS_PARTS:=pingpong verbs transport collective elastic rejoin}"

res() { echo "VERBS-TAP $*"; }

# Re-emit a TAP program's results, prefixed with its name.
sub_tap() {
    name=$1
    shift
    "$@" >/tmp/sub.out 2>/tmp/sub.err
    rc=$?
    awk -v n="$name" '
        /^ok / || /^not ok / {
            s = $0; okp = ($1 == "ok"); sub(/^(not )?ok [0-9]+/, "", s); sub(/^ *-? */, "", s)
            if (s ~ /# SKIP/) { sub(/ *# SKIP */, "", s); print "VERBS-TAP skip - " n ": " s }
            else print "VERBS-TAP " (okp ? "ok" : "not ok") " - " n ": " s
            next }
        /^1\.\.0/ { sub(/^1\.\.0 *# *(SKIP|skip)? */, ""); print "VERBS-TAP skip - " n ": " $0; next }
        /^#/ { print "VERBS-TAP " $0 }' /tmp/sub.out
    grep -q '^\(not \)\?ok \|^1\.\.0' /tmp/sub.out ||
        res "not ok - $name: no TAP output (exit $rc): $(tail -n 3 /tmp/sub.err | tr '\n' ' ')"
}

if guest_one_host; then
    res "ok - Soft-RoCE rxe0 over a dummy netdev"
else
    res "not ok - Soft-RoCE rxe0 over a dummy netdev"
    exit 0
fi
g=$(guest_gid rxe0)

for part in $VERBS_PARTS; do
    case $part in
    pingpong)
        ibv_rc_pingpong -d rxe0 -g "$g" -n 200 >/tmp/pp.srv 2>&1 &
        srv=$!
        # The client gives up at once when the server is not listening yet.
        i=0
        until ibv_rc_pingpong -d rxe0 -g "$g" -n 200 127.0.0.1 \
            >/tmp/pp.cli 2>&1; do
            i=$((i + 1))
            [ $i -lt 20 ] && grep -q "Couldn't connect" /tmp/pp.cli || break
            sleep 1
        done
        if grep -q "200 iters" /tmp/pp.cli && wait $srv; then
            res "ok - ibv_rc_pingpong: 200 RC round trips"
        else
            kill $srv 2>/dev/null
            res "not ok - ibv_rc_pingpong: $(tail -n 2 /tmp/pp.cli /tmp/pp.srv | tr '\n' ' ')"
        fi
        ;;
    verbs)
        sub_tap test_verbs "$B/tests/verbs/test_verbs"
        ;;
    transport)
        sub_tap "test_transport verbs" "$B/tests/test_transport" verbs
        ;;
    collective)
        sub_tap "test_collective verbs" "$B/tests/test_collective" 3 verbs
        ;;
    auto)
        # the default transport on 2 pretended hosts of 2 (shared memory
        # inside one, verbs over rxe0 between): every collective bitwise,
        # a kill and a stop mid-all-reduce
        sub_tap "test_collective auto" "$B/tests/test_collective" 1 auto 2x2
        ;;
    elastic)
        # --elastic over verbs: 3 peers, peer 2 killed at step 6; the two
        # others agree on a new view, set up new QPs and finish.
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 |
            tr -d ' \n' >/tmp/el.secret)
        pids=
        for r in 0 1 2; do
            MESHTRAIN_TEST_FAULT=2:between:5 "$B/meshtrain" \
                -H 10.77.0.1:3 --rank $r --port 23500 \
                --secret-file /tmp/el.secret --transport verbs \
                --ib-dev rxe0 --elastic --model resnet18 --width 4 \
                --cifar-stem --image-size 12 --threads 1 --data-threads 1 \
                --quiet --data synthetic:240 --num-classes 10 \
                --in-channels 1 --batch 4 --no-eval --iters 12 \
                --peer-timeout 10 --join-timeout 120 \
                >/tmp/el.$r 2>&1 &
            pids="$pids $!"
        done
        codes=
        for p in $pids; do
            wait "$p"
            codes="$codes $?"
        done
        if [ "$codes" = " 0 0 137" ] && grep -q "view 1:" /tmp/el.0; then
            res "ok - --elastic over verbs: peer 2 of 3 killed, the 2 others changed the view and finished"
        else
            res "not ok - --elastic over verbs: exit codes$codes: $(grep -v info: /tmp/el.0 | tail -n 3 | tr '\n' ' ')"
        fi
        ;;
    rejoin)
        # --elastic over verbs: 3 peers, peer 2 killed at step 5 and
        # started again at once; it joins the 2 others, which send it the
        # state over verbs (train/xfer.c; what a catch-up on its TCP side
        # connections could not rebuild, train/catchup.c), and all 3
        # finish. The members wait at step 12 for it
        # (MESHTRAIN_TEST_JOIN_AT), so that they cannot end the run while
        # the restarted peer still starts or catches up under TCG.
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 |
            tr -d ' \n' >/tmp/rj.secret)
        rj() { # rj RANK FAULT: one peer, log /tmp/rj.RANK
            MESHTRAIN_TEST_FAULT=$2 MESHTRAIN_TEST_JOIN_AT=12 \
                "$B/meshtrain" -H 10.77.0.1:3 --rank "$1" --port 23600 \
                --secret-file /tmp/rj.secret --transport verbs \
                --ib-dev rxe0 --elastic --model resnet18 --width 4 \
                --cifar-stem --image-size 12 --threads 1 --data-threads 1 \
                --quiet --data synthetic:240 --num-classes 10 \
                --in-channels 1 --batch 4 --no-eval --iters 40 \
                --peer-timeout 10 --join-timeout 120 >>"/tmp/rj.$1" 2>&1
        }
        rm -f /tmp/rj.0 /tmp/rj.1 /tmp/rj.2
        rj 0 2:between:5 &
        p0=$!
        rj 1 2:between:5 &
        p1=$!
        rj 2 2:between:5
        c2=$?
        rj 2 "" &
        p2=$!
        codes=
        for p in $p0 $p1 $p2; do
            wait "$p"
            codes="$codes $?"
        done
        if [ "$c2$codes" = "137 0 0 0" ] &&
            grep -q "slot(s) 2 joined" /tmp/rj.0 &&
            grep -q "slot 2 joined view" /tmp/rj.2; then
            res "ok - --elastic over verbs: peer 2 of 3 killed and started again, it rejoined with the state sent over verbs"
        else
            res "not ok - --elastic over verbs, rejoin: exit codes $c2$codes: $(grep -v info: /tmp/rj.0 /tmp/rj.2 | tail -n 4 | tr '\n' ' ')"
        fi
        ;;
    esac
done
