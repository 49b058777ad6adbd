#!/bin/sh
# tests/mesh_sweep.sh: meshbench's four collectives over layouts a user
# would run, at odd counts (1, 3, primes, not divisible by the ranks), each
# row against meshbench's reference (#wrong 0 in both placements):
# - 5 ranks over TCP with a 7-byte --chunk (odd, below a float): every
#   schedule posts about 32,000 receives per link at once. Posting walked
#   the link's list to its end each time, under the transport's lock, so
#   the progress thread sent no heartbeat for seconds and the peers took
#   the posting rank for dead ("silent for 10 s", exit 3; seen at a load
#   of 20).
# - 2 hosts of 3 (network namespaces: shared memory inside each, TCP
#   between; 127.0.0.1 and 127.0.0.2, as this row had them first, are one
#   machine to the shm transport, so the collectives saw one host of 6
#   and htree's hierarchy never ran) with htree, bfloat16, a broadcast
#   root in the middle; a skip without root or namespaces;
# - 7 ranks (not a power of two) with rd, float, avg.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 3

# sweep NAME ROWS HOSTS... -- MESHBENCH-ARGS: one meshbench run; ok when it
# exits 0 with ROWS table rows, each with #wrong 0 in both placements.
sweep() {
    _name=$1
    _want=$2
    shift 2
    _log=$TMP/$_name.log
    timeout 300 "$MESHRUN" "$@" < /dev/null > "$_log" 2>&1
    _rc=$?
    # [0] size count type redop root time algbw busbw #wrong (x2) algo
    _rows=$(grep -E '^\[0\] +[0-9]+ +[0-9]+ +(float|half|bfloat16) ' "$_log" |
            awk 'NF == 15 && $10 == 0 && $14 == 0 { n++ } END { print n + 0 }')
    t_ok "$([ $_rc -eq 0 ] && [ "$_rows" -eq "$_want" ] &&
           grep -q '# Out of bounds values : 0 OK' "$_log" &&
           grep -q "${WANT_LINE:-}" "$_log"; echo $?)" \
        "$_name: exit $_rc, $_rows of $_want rows exact"
    [ $_rc -eq 0 ] && [ "$_rows" -eq "$_want" ] ||
        grep -v '] info: ' "$_log" | tail -n 8 | cut -c 1-300 | sed 's/^/#   /'
}

# counts 1, 7, 49 and 343 per op (reduce-scatter and all-gather: whole
# blocks per rank, so 0, 1, 9 and 68 each of the 5); the formation's
# measure of alpha and beta is a 4 MiB ring all-reduce, 4,096 chunks of
# 13 floats per slice
take_ports 5 || t_skip_all "no free ports"
sweep "5 ranks, tcp, --chunk 7, every op at 1-343 elements" 16 -np 5 -- \
    "$MESHBENCH" --port "$PORT" --transport tcp \
    --op allreduce,reduce_scatter,allgather,broadcast --algo tree \
    --chunk 7 -d half -o avg --root 3 -b 2 -e 686 -f 7 -n 1 -w 0

take_ports 3
if t_netns_try ms 2; then
    t_netns_agent "$TMP/agent"
    printf '10.77.0.1 slots=3 port=%s\n10.77.0.2 slots=3 port=%s\n' \
        "$PORT" "$PORT" > "$TMP/hosts"
    WANT_LINE="collectives: 2 host(s) of 3 ranks: hier runs"
    sweep "2 hosts of 3, htree, every op, bfloat16, 3-3,993 elements" 16 \
        --launcher ssh --ssh "$TMP/agent" --hostfile "$TMP/hosts" -- \
        "$MESHBENCH" --op allreduce,reduce_scatter,allgather,broadcast \
        --algo htree -d bfloat16 --root 2 -b 6 -e 9438 -f 11 -n 1 -w 0
    WANT_LINE=
else
    t_skip "2 hosts of 3: $NETNS_WHY"
fi

take_ports 7
sweep "7 ranks, rd, every op, float avg, 13-28,561 elements" 16 -np 7 -- \
    "$MESHBENCH" --port "$PORT" --op allreduce,reduce_scatter,allgather,broadcast \
    --algo rd -o avg --root 6 -b 52 -e 114244 -f 13 -n 1 -w 0
t_done
