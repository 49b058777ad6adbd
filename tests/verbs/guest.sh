#!/bin/sh
# tests/verbs/guest.sh BUILDDIR SRCDIR: the verbs lane's job, run inside the
# QEMU guest (chrooted into the host's read-only root, /tmp a tmpfs) by
# tests/verbs/lane.sh. Prints "VERBS-TAP ok|not ok|skip - what" and
# "VERBS-TAP # diag" lines on the console; the lane turns them into TAP.
B=$1
S=$2
. "$S/tests/verbs/guest-lib.sh"
export MESHTRAIN_TEST_SLOW=${MESHTRAIN_TEST_SLOW:-4}
: "${VERBS_PARTS:=pingpong verbs transport collective hosts}"

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
two=0
if guest_two_hosts; then
    two=1
    res "ok - two hosts: namespaces h1, h2 over a veth pair, rxe1 and rxe2"
else
    res "not ok - two hosts: namespaces h1, h2 over a veth pair, rxe1 and rxe2"
fi
g=$(guest_gid rxe0)

for part in $VERBS_PARTS; do
    case $part in
    pingpong)
        ibv_rc_pingpong -d rxe0 -g "$g" -n 200 >/tmp/pp.srv 2>&1 &
        sleep 1
        if ibv_rc_pingpong -d rxe0 -g "$g" -n 200 127.0.0.1 >/tmp/pp.cli 2>&1 &&
            wait $!; then
            res "ok - ibv_rc_pingpong: 200 RC round trips"
        else
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
    hosts)
        [ "$two" = 1 ] || { res "skip - two hosts: no namespaces"; continue; }
        H=10.78.0.1:1,10.78.0.2:1
        umask 077
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >/tmp/secret
        M="-H $H --secret-file /tmp/secret --transport verbs"
        ip netns exec h2 "$B/meshbench" $M --rank 1 --ib-dev rxe2 \
            --op allreduce -b 8 -e 4M -f 8 -n 5 -w 2 >/tmp/mb1 2>&1 &
        if ip netns exec h1 "$B/meshbench" $M --rank 0 --ib-dev rxe1 \
            --op allreduce -b 8 -e 4M -f 8 -n 5 -w 2 >/tmp/mb0 2>&1 &&
            wait $!; then
            res "ok - two hosts: meshbench all-reduce over verbs, 8 B..4 MiB, checked"
            sed 's/^/VERBS-TAP # /' /tmp/mb0 | grep -v "^VERBS-TAP # \[" | tail -n 8
        else
            res "not ok - two hosts: meshbench all-reduce over verbs: $(tail -n 3 /tmp/mb0 /tmp/mb1 | tr '\n' ' ')"
        fi
        # A 2-peer training step over verbs (a tiny ResNet, synthetic data).
        T="--model resnet18 --width 8 --image-size 32 --cifar-stem --data synthetic:32 --batch 4 --iters 2 --no-eval --threads 1 --data-threads 1 --quiet"
        ip netns exec h2 "$B/meshtrain" $M --rank 1 --ib-dev rxe2 $T \
            >/tmp/tr1 2>&1 &
        if ip netns exec h1 "$B/meshtrain" $M --rank 0 --ib-dev rxe1 $T \
            >/tmp/tr0 2>&1 && wait $!; then
            res "ok - two hosts: 2 meshtrain steps over verbs (resnet18 width 8)"
        else
            res "not ok - two hosts: meshtrain over verbs: $(tail -n 3 /tmp/tr0 /tmp/tr1 | tr '\n' ' ')"
        fi
        ;;
    perf)
        # meshbench all-reduce busbw vs perftest's ib_write_bw, same link.
        [ "$two" = 1 ] || continue
        H=10.78.0.1:1,10.78.0.2:1
        g1=$(guest_gid rxe1)
        g2=$(guest_gid rxe2)
        ip netns exec h2 ib_write_bw -d rxe2 -x "$g2" -s 4194304 -n 20 -F \
            >/tmp/bw.srv 2>&1 &
        sleep 1
        ip netns exec h1 ib_write_bw -d rxe1 -x "$g1" -s 4194304 -n 20 -F \
            10.78.0.2 >/tmp/bw.cli 2>&1
        wait
        sed 's/^/VERBS-TAP # ib_write_bw: /' /tmp/bw.cli | tail -n 4
        ip netns exec h2 "$B/meshbench" -H $H --insecure --transport verbs \
            --rank 1 --ib-dev rxe2 --op allreduce -b 4M -e 4M -n 10 -w 2 \
            >/tmp/pb1 2>&1 &
        ip netns exec h1 "$B/meshbench" -H $H --insecure --transport verbs \
            --rank 0 --ib-dev rxe1 --op allreduce -b 4M -e 4M -n 10 -w 2 \
            >/tmp/pb0 2>&1
        wait
        sed 's/^/VERBS-TAP # meshbench: /' /tmp/pb0 | grep -v "meshbench: \[" | tail -n 4
        ;;
    esac
done
