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

# need FILE PATTERN WHAT: a check's condition; one that fails is named
# in $why, with the pattern and file.
need() {
    grep -q "$2" "$1" ||
        why="${why:+$why; }not $3 (no \"$2\" in ${1#/tmp/})"
}

# rj_diag FILE...: the catch-up's lines of the peers' logs, as TAP
# diagnostics; the logs themselves come back whole (guest_logs).
rj_diag() {
    grep "catch-up\|caught up\|MESHTRAIN_TEST_SIDE\|joined view\|view [0-9]*:\|error" "$@" |
        sed "s|^/tmp/|VERBS-TAP # |"
    rj_bad=1
}

# The guest's files on the console, for the lane to write back
# (tests/verbs/lane.sh: tests/verbs/lane-logs/NAME).
guest_logs() {
    for f in "$@"; do
        [ -f "$f" ] || continue
        n=${f##*/}
        sed "s|^|VERBS-LOG $n: |" "$f"
    done
}

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
        # others agree on a new view, set up new QPs and finish. With the
        # rejoin part, its first half checks this (the same 3 peers, the
        # same kill): one start of 3 peers under TCG instead of two.
        case " $VERBS_PARTS " in *" rejoin "*) continue ;; esac
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
        # started again at once. The 2 others train on while it catches
        # up in the background (train/catchup.c): it reads their
        # snapshot's stripes and the gradients of the steps that pass
        # over RDMA, on side channels of its own (queue pairs on rxe0,
        # their addresses swapped on the authenticated TCP side
        # connection); then it is admitted, and all 3 finish with the same
        # weights (meshtrain compares the digests after the view change
        # and every 10 steps: a mismatch exits 4). The members pause 0.3 s
        # a step (MESHTRAIN_TEST_STEP_MS), which leaves the joiner the
        # guest's CPUs for its start; only a joiner that has not come by
        # step $late1 (the second: $late2, the third: $late3) is waited
        # for there (MESHTRAIN_TEST_JOIN_AT), so that the members cannot
        # end the run without it. The fallbacks, forced by
        # MESHTRAIN_TEST_SIDE: slot 0 answers the first joiner's side
        # channel with none (its stripe comes over TCP) and its first try
        # with LATE, and slot 1 forges its SNAP record's rkey after
        # signing it (the joiner refuses it, naming slot 1, and reads the
        # snapshot from slot 0 alone, over RDMA). That joiner is killed
        # again at step $kill2 (once admitted), and the next one has no
        # RDMA device: it catches up over TCP from the members, which have
        # one, and rejoins. It is killed at step $kill3, and the third
        # one meets a side channel that never answers (slot 0: its reads
        # fail within --peer-timeout) and a malformed address (slot 1):
        # it reads each of those stripes over TCP, naming the member,
        # and rejoins (the aids wait for step $kill3: @STEP). With the
        # elastic part, its check is made here too (the peers' first
        # view change).
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 |
            tr -d ' \n' >/tmp/rj.secret)
        iters=${VERBS_RJ_ITERS:-140}
        kill2=$((iters * 5 / 14))
        kill3=$((iters * 9 / 14))
        late1=$((kill2 - 8))
        late2=$((kill3 - 8))
        late3=$((iters - 8))
        rj() { # rj RANK FAULT SIDE: one peer, log /tmp/rj.RANK
            MESHTRAIN_TEST_FAULT=$2 MESHTRAIN_TEST_SIDE=$3 \
                MESHTRAIN_TEST_JOIN_AT=$late1,$late2,$late3 \
                MESHTRAIN_TEST_STEP_MS=${VERBS_RJ_STEP_MS:-300} \
                "$B/meshtrain" -H 10.77.0.1:3 --rank "$1" --port 23600 \
                --secret-file /tmp/rj.secret --transport verbs \
                --ib-dev rxe0 --elastic --model resnet18 --width 4 \
                --cifar-stem --image-size 12 --threads 1 --data-threads 1 \
                --quiet --data synthetic:240 --num-classes 10 \
                --in-channels 1 --batch 4 --no-eval --iters "$iters" \
                --verify-every 10 --peer-timeout 10 --join-timeout 120 \
                >>"/tmp/rj.$1" 2>&1
        }
        rm -f /tmp/rj.0 /tmp/rj.1 /tmp/rj.2 /tmp/rj.2.*
        t0=$(cut -d' ' -f1 /proc/uptime)
        rj 0 2:between:5 "refuse,late,silent@$kill3" &
        p0=$!
        rj 1 2:between:5 "forge,garble@$kill3" &
        p1=$!
        rj 2 2:between:5 ""
        c2=$?
        t1=$(cut -d' ' -f1 /proc/uptime)
        mv /tmp/rj.2 /tmp/rj.2.before
        rj 2 "2:between:$kill2" ""
        c2b=$?
        t2=$(cut -d' ' -f1 /proc/uptime)
        mv /tmp/rj.2 /tmp/rj.2.first
        rj 2 "2:between:$kill3" none
        c2c=$?
        t3=$(cut -d' ' -f1 /proc/uptime)
        mv /tmp/rj.2 /tmp/rj.2.second
        rj 2 "" "" &
        p2=$!
        codes=
        for p in $p0 $p1 $p2; do
            wait "$p"
            codes="$codes $?"
        done
        # "catch-up over RDMA (rxe0 port 1): N of the snapshot's N bytes
        # and G bytes of gradients read from the members' memory"
        case " $VERBS_PARTS " in
        *" elastic "*)
            if [ "$c2${codes% *}" = "137 0 0" ] && grep -q "view 1:" /tmp/rj.0; then
                res "ok - --elastic over verbs: peer 2 of 3 killed, the 2 others changed the view and went on"
            else
                res "not ok - --elastic over verbs: exit codes $c2${codes% *}: $(grep -v info: /tmp/rj.0 | tail -n 3 | tr '\n' ' ')"
            fi
            ;;
        esac
        rd=$(sed -n "s/.*catch-up over RDMA ([^)]*): \([0-9]*\) of the snapshot's \([0-9]*\) bytes and \([0-9]*\) bytes of gradients.*/\1 \2 \3/p" /tmp/rj.2.first | tail -n 1)
        set -- $rd
        res "# rejoin: started at ${t0} s (uptime), peer 2 killed at $t1 s, $t2 s and $t3 s, all done at $(cut -d' ' -f1 /proc/uptime) s"
        res "# rejoin: $(grep -h "caught up in the background\|catch-up over RDMA\|slot 2 joined view\|slot 2's join" /tmp/rj.2.first | sed 's/^.*\] //' | tr '\n' ' ')"
        all="$c2 $c2b $c2c$codes"
        rj_bad=
        why=
        [ "$all" = "137 137 137 0 0 0" ] ||
            why="exit codes $all, not 137 137 137 0 0 0 (the first start, the first and second joiners, slots 0 and 1, the third joiner)"
        need /tmp/rj.0 "slot(s) 2 joined" "slot 0 saw slot 2 join"
        need /tmp/rj.2.first "slot 2 joined view" "the first joiner joined"
        need /tmp/rj.2.first "caught up in the background" "the first joiner caught up in the background"
        if [ -z "$rd" ] || [ "$1" != "$2" ] || [ "$1" -le 0 ]; then
            why="${why:+$why; }not the whole snapshot over RDMA (${rd:-no RDMA line})"
        fi
        if [ -z "$why" ]; then
            res "ok - --elastic over verbs: peer 2 of 3 killed and started again; it caught up while the others trained, reading the snapshot ($1 bytes) and $3 bytes of gradients over RDMA, and rejoined"
        else
            res "not ok - --elastic over verbs, rejoin with a catch-up over RDMA: $why"
            rj_diag /tmp/rj.0 /tmp/rj.1 /tmp/rj.2.first
        fi
        # the fallbacks: a member that answers no side channel (TCP for
        # its stripe), a member that ends the joiner's first try (LATE)
        # while the other serves a forged rkey (refused, naming it, in
        # that try or the next: a forge stands until the joiner is
        # admitted; then its stripe comes from slot 0 alone)
        why=
        need /tmp/rj.0 "MESHTRAIN_TEST_SIDE: refuse, to slot 2" "slot 0 took refuse"
        need /tmp/rj.2.first "catch-up: slot 0 has no RDMA side channel: its stripe comes over TCP" \
            "the joiner saw slot 0's refusal"
        need /tmp/rj.0 "MESHTRAIN_TEST_SIDE: late, to slot 2" "slot 0 took late"
        need /tmp/rj.2.first "catch-up: slot 0 is past step [0-9]* (LATE" "the joiner saw slot 0's LATE"
        need /tmp/rj.1 "MESHTRAIN_TEST_SIDE: forge, to slot 2" "slot 1 took forge"
        need /tmp/rj.2.first "catch-up: slot 1 ([^)]*) sent a SNAP record whose header is not signed.*refused; its stripe is fetched from the other member" \
            "the joiner refused slot 1's forged SNAP record"
        last=$(grep "its stripes came" /tmp/rj.2.first | tail -n 1)
        case $last in
        *"slot 1 "*) why="${why:+$why; }the snapshot came from slot 1 too ($last)" ;;
        *": slot 0 "*) ;;
        *) why="${why:+$why; }no snapshot from slot 0 (${last:-no stripes line})" ;;
        esac
        if [ -z "$why" ]; then
            res "ok - --elastic over verbs: slot 0 refused a side channel (its stripe came over TCP) and slot 1's forged rkey was refused, naming it (the snapshot then came from slot 0), though slot 0's LATE ended a try"
        else
            res "not ok - --elastic over verbs: the refused side channel or the forged rkey was not seen as such: $why"
            rj_diag /tmp/rj.0 /tmp/rj.1 /tmp/rj.2.first
        fi
        # the second joiner, without an RDMA device
        why=
        [ "$all" = "137 137 137 0 0 0" ] || why="exit codes $all"
        need /tmp/rj.2.second "no RDMA side channels (MESHTRAIN_TEST_SIDE=none): the state comes over TCP" \
            "the second joiner went without a device"
        need /tmp/rj.2.second "caught up in the background" "the second joiner caught up in the background"
        ! grep -q "catch-up over RDMA" /tmp/rj.2.second ||
            why="${why:+$why; }the second joiner read over RDMA"
        need /tmp/rj.0 "slot 2 has no RDMA side channel: its stripe goes over TCP" \
            "slot 0 sent the second joiner its stripe over TCP"
        need /tmp/rj.2.second "slot 2 joined view" "the second joiner joined"
        if [ -z "$why" ]; then
            res "ok - --elastic over verbs: a joiner without an RDMA device caught up over TCP from members with one, and rejoined with the same weights"
        else
            res "not ok - --elastic over verbs: the joiner without an RDMA device: $why"
            rj_diag /tmp/rj.0 /tmp/rj.1 /tmp/rj.2.second
        fi
        # the third joiner: slot 0's side channel never answers (its
        # read fails within --peer-timeout, 10 s here: no completion for
        # that long; 2 x that allows for the guest's load), slot 1's
        # address is malformed; each of their stripes then comes over
        # TCP, and it rejoins with the same weights
        why=
        [ "$all" = "137 137 137 0 0 0" ] || why="exit codes $all"
        need /tmp/rj.0 "MESHTRAIN_TEST_SIDE: silent, to slot 2" "slot 0 took silent"
        need /tmp/rj.1 "MESHTRAIN_TEST_SIDE: garble, to slot 2" "slot 1 took garble"
        need /tmp/rj.2 "catch-up: slot 1's side channel: a side channel's address is malformed.*its stripe over TCP" \
            "the third joiner refused slot 1's malformed address"
        stall=$(sed -n "s/.*catch-up: slot 0: an RDMA read of .*, \([0-9.]*\) s after the read of [0-9]* bytes began; trying again, its stripe over TCP.*/\1/p" /tmp/rj.2 | head -n 1)
        if [ -z "$stall" ]; then
            why="${why:+$why; }no failed read from slot 0 (catch-up: slot 0: an RDMA read ..., N s after the read ... began)"
        elif ! awk -v s="$stall" 'BEGIN { exit !(s <= 20) }'; then
            why="${why:+$why; }slot 0's read failed after $stall s, more than 2 x --peer-timeout"
        fi
        need /tmp/rj.2 "caught up in the background" "the third joiner caught up in the background"
        need /tmp/rj.2 "slot 2 joined view" "the third joiner joined"
        if [ -z "$why" ]; then
            res "ok - --elastic over verbs: a side channel that never answers (its read failed after $stall s) and a malformed address: the joiner read those stripes over TCP, naming each member, and rejoined with the same weights"
        else
            res "not ok - --elastic over verbs: a silent side channel and a malformed address: $why"
            rj_diag /tmp/rj.0 /tmp/rj.1 /tmp/rj.2
        fi
        # the peers' logs back to the host (tests/verbs/lane-logs)
        if [ "${VERBS_LOGS:-0}" = 1 ] || [ -n "$rj_bad" ]; then
            guest_logs /tmp/rj.0 /tmp/rj.1 /tmp/rj.2.before /tmp/rj.2.first \
                /tmp/rj.2.second /tmp/rj.2
        fi
        ;;
    esac
done
