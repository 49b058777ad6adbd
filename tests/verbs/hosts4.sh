#!/bin/sh
# tests/verbs/hosts4.sh ROLE BUILDDIR SECRET: the "hosts4" part of the
# verbs lane, run by tests/verbs/guest-host.sh in each of the two guests
# (host ROLE is 10.79.0.(ROLE+1), rxe0 set up). Each guest runs 2 ranks
# (2 ROLE and 2 ROLE + 1) of a 4-rank job on the default transport, auto:
# shared memory between the two ranks of a guest, verbs between the guests.
#   - every link's log line says what it uses: the rank of its own guest
#     by shared memory, the two of the other by RDMA verbs;
#   - meshbench all-reduce (auto and hier), reduce-scatter, all-gather and
#     broadcast, 8 B..1 MiB, every element of every rank checked (a wrong
#     one makes meshbench exit 4);
#   - rank 3 (guest 1) is killed with SIGKILL mid-all-reduce: every
#     survivor fails in an all-reduce ("allreduce (collective #N; ...):
#     rank 3 ...", the communicator's timed ones or the benchmark's)
#     naming it; rank 2, in the victim's guest, within the
#     peer timeout (10 s) plus 5 s of slack for the emulated machine; the
#     ranks of guest 0, whose clock is not the same, end on their own long
#     before the run would have (it is 100000 all-reduces).
R=$1 B=$2 SECRET=$3
res() { echo "VERBS-TAP $*"; }
H="-H 10.79.0.1:2,10.79.0.2:2 --secret-file $SECRET --ib-dev rxe0 --join-timeout 120 --peer-timeout 10"
a=$((2 * R))
b=$((2 * R + 1))

# Both ranks of this guest: meshbench PORT ARGS...; exit codes in $codes.
pair_run() {
    port=$1
    shift
    "$B/meshbench" $H --port "$port" --rank $a "$@" >/tmp/h4.$a 2>&1 &
    pa=$!
    "$B/meshbench" $H --port "$port" --rank $b "$@" >/tmp/h4.$b 2>&1 &
    pb=$!
    wait $pa
    ca=$?
    wait $pb
    codes="$ca $?"
}

port=24600
for op in "allreduce" "allreduce --algo hier" "reduce_scatter" "allgather" "broadcast"; do
    pair_run $port --op $op -b 8 -e 1M -f 16 -n 2 -w 1
    port=$((port + 4))
    if [ "$codes" = "0 0" ]; then
        res "ok - host $R: ranks $a and $b, default transport, $op 8 B..1 MiB, every element checked"
    else
        res "not ok - host $R: $op (exit codes $codes): $(grep -v info: /tmp/h4.$a | tail -n 3 | tr '\n' ' ')"
    fi
    if [ "$op" = allreduce ]; then
        for r in $a $b; do
            local_=$((r ^ 1))
            n_shm=$(grep -c "shm: rank $local_ (10\.79\.0\.$((R + 1)):[0-9]*) shares this host: shared memory" /tmp/h4.$r)
            n_rdma=$(grep -c "shm: rank [0-9] (10\.79\.0\.$((2 - R)):[0-9]*) is on another host: RDMA verbs" /tmp/h4.$r)
            if [ "$n_shm" = 1 ] && [ "$n_rdma" = 2 ]; then
                res "ok - host $R: rank $r logs its guest's rank by shared memory, the 2 of the other guest by RDMA verbs"
            else
                res "not ok - host $R: rank $r's links ($n_shm by shared memory, $n_rdma by verbs): $(grep 'shm: rank\|auto transport' /tmp/h4.$r | tr '\n' ' ')"
            fi
        done
    fi
done

# SIGKILL of rank 3 mid-all-reduce (guest 0's ranks under a limit of
# their own: a rank that never noticed would run for hours).
lim=
[ "$R" = 0 ] && lim="timeout 300"
K="--port 24640 --op allreduce --algo ring -b 1M -e 1M -n 1000000000 -w 1"
$lim "$B/meshbench" $H $K --rank $a >/tmp/h4k.$a 2>&1 &
pa=$!
$lim "$B/meshbench" $H $K --rank $b >/tmp/h4k.$b 2>&1 &
pb=$!
if [ "$R" = 1 ]; then
    i=0
    until grep -q "joined the mesh" /tmp/h4k.3 2>/dev/null || [ $i -ge 150 ]; do
        sleep 1
        i=$((i + 1))
    done
    # inside the all-reduces (the communicator's timed ones or the
    # benchmark's, which run until rank 3 is killed)
    sleep 10
    kill -9 $pb
    t0=$(date +%s.%N)
    wait $pa
    ca=$?
    t1=$(date +%s.%N)
    wait $pb
    secs=$(echo "$t0 $t1" | awk '{ printf "%.2f", $2 - $1 }')
    if [ "$ca" != 0 ] && grep -q "allreduce (collective #[0-9]*;[^)]*): rank 3 (10\.79\.0\.2:[0-9]*)" /tmp/h4k.2 &&
        awk -v s="$secs" 'BEGIN { exit !(s <= 15) }'; then
        res "ok - host 1: rank 3 killed mid-all-reduce: rank 2 (same guest) fails naming it after $secs s (bound 15 s)"
    else
        res "not ok - host 1: rank 3 killed: rank 2 exit $ca after $secs s: $(grep -v info: /tmp/h4k.2 | tail -n 2 | tr '\n' ' ')"
    fi
    res "# host 1: rank 3 killed at $t0"
    grep "allreduce (collective" /tmp/h4k.2 | head -n 1 | cut -c1-300 | sed 's/^/VERBS-TAP # /'
else
    wait $pa
    ca=$?
    t1=$(date +%s.%N)
    wait $pb
    cb=$?
    named=0
    grep -q "allreduce (collective #[0-9]*;[^)]*): rank 3 (10\.79\.0\.2:[0-9]*)" /tmp/h4k.0 &&
        grep -q "allreduce (collective #[0-9]*;[^)]*): rank 3 (10\.79\.0\.2:[0-9]*)" /tmp/h4k.1 && named=1
    if [ "$ca" != 0 ] && [ "$ca" != 124 ] && [ "$cb" != 0 ] &&
        [ "$cb" != 124 ] && [ "$named" = 1 ]; then
        res "ok - host 0: rank 3 killed mid-all-reduce: ranks 0 and 1 (the other guest, over verbs) fail naming it (exit codes $ca $cb)"
    else
        res "not ok - host 0: rank 3 killed: exit codes $ca $cb, named $named: $(grep -v info: /tmp/h4k.0 | tail -n 2 | tr '\n' ' ')"
    fi
    res "# host 0: ranks 0 and 1 ended at $t1"
    grep "allreduce (collective" /tmp/h4k.0 | head -n 1 | cut -c1-300 | sed 's/^/VERBS-TAP # /'
fi
exit 0
