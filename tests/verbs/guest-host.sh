#!/bin/sh
# tests/verbs/guest-host.sh ROLE BUILDDIR SRCDIR SECRET: one of the two
# "hosts" of the verbs lane (tests/verbs/lane.sh boots two guests joined by
# one virtio-net link). Host ROLE (0 or 1) is 10.79.0.(ROLE+1) on eth0 with
# rxe0 over it, and runs rank ROLE of: meshbench all-reduce over verbs
# (every byte checked), a 2-peer training step over verbs, and, with
# VERBS_PERF=1, perftest's ib_write_bw against meshbench on the same link
# (VERBS_HOSTS has "hosts"); with "hosts4" in VERBS_HOSTS, first
# tests/verbs/hosts4.sh (2 ranks per guest on the default transport).
R=$1 B=$2 S=$3 SECRET=$4
res() { echo "VERBS-TAP $*"; }
ip link set lo up &&
    ip addr add "10.79.0.$((R + 1))/24" dev eth0 &&
    ip link set eth0 up &&
    rdma link add rxe0 type rxe netdev eth0 || {
    res "not ok - host $R: eth0 and rxe0 setup"
    exit 0
}
res "ok - host $R: rxe0 over its own virtio-net link (10.79.0.$((R + 1)))"
M="-H 10.79.0.1:1,10.79.0.2:1 --rank $R --secret-file $SECRET --transport verbs --ib-dev rxe0 --join-timeout 120"

# VERBS_HOSTS: which of the pair's parts run ("hosts": 1 rank per host over
# verbs; "hosts4": 2 ranks per host, default transport; see hosts4.sh).
case " ${VERBS_HOSTS:-hosts} " in
*" hosts4 "*) sh "$S/tests/verbs/hosts4.sh" "$R" "$B" "$SECRET" ;;
esac
case " ${VERBS_HOSTS:-hosts} " in
*" hosts "*) ;;
*) exit 0 ;;
esac

if "$B/meshbench" $M --op allreduce -b 8 -e 4M -f 8 -n 5 -w 2 >/tmp/mb 2>&1; then
    res "ok - host $R: meshbench all-reduce over verbs between two hosts, 8 B..4 MiB, every byte checked"
    [ "$R" = 0 ] && grep -v '^\[' /tmp/mb | tail -n 9 | sed 's/^/VERBS-TAP # /'
else
    res "not ok - host $R: meshbench over verbs: $(tail -n 4 /tmp/mb | tr '\n' ' ')"
fi

T="--model resnet18 --width 8 --image-size 32 --cifar-stem --data synthetic:32 --batch 4 --iters 2 --no-eval --threads 1 --data-threads 1 --quiet"
if "$B/meshtrain" $M $T >/tmp/tr 2>&1; then
    res "ok - host $R: 2 training steps of meshtrain over verbs (resnet18, width 8, 2 peers)"
else
    res "not ok - host $R: meshtrain over verbs: $(tail -n 4 /tmp/tr | tr '\n' ' ')"
fi

[ "${VERBS_PERF:-0}" = 1 ] || exit 0
. "$S/tests/verbs/guest-lib.sh"
g=$(guest_gid rxe0)
if [ "$R" = 1 ]; then
    ib_write_bw -d rxe0 -x "$g" -s 4194304 -n 50 -F >/tmp/bw 2>&1
else
    sleep 5
    ib_write_bw -d rxe0 -x "$g" -s 4194304 -n 50 -F 10.79.0.2 >/tmp/bw 2>&1
    grep -A1 '#bytes' /tmp/bw | sed 's/^/VERBS-TAP # ib_write_bw: /'
fi
sleep 2
"$B/meshbench" $M --op allreduce -b 4M -e 4M -n 20 -w 3 >/tmp/pb 2>&1
[ "$R" = 0 ] && grep -v '^\[' /tmp/pb | grep -E '^#  *size|^ *[0-9]' |
    sed 's/^/VERBS-TAP # meshbench: /'
exit 0
