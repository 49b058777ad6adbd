#!/bin/sh
# tests/coll_meshbench.sh: meshbench's collective operations end to end:
# 3 peers on loopback started by meshrun run all-reduce (each algorithm;
# htree and hrd as one host's leader form, local in the host's windows),
# reduce-scatter, all-gather and broadcast at odd sizes in every dtype;
# every row must have the nccl-tests columns with #wrong 0 for both
# placements, and the table must end with the summary lines. Then flags
# that make no sense must be refused with a usage error (exit 1), and a
# spoiled input byte must be counted wrong and make every rank exit 4.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 27
n=3
for algo in ring tree direct rd rhd htree hrd local ps auto; do
    take_ports "$n" || { t_ok 1 "no free ports"; continue; }
    port=$PORT
    log=$TMP/ar_$algo.log
    timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
        --join-timeout 30 --op allreduce --algo "$algo" -d half -o avg \
        -b 6 -e 3M -f 9 -n 2 -w 1 > "$log" 2>&1
    rc=$?
    # [0] size count type redop root time algbw busbw #wrong (x2) algo: 15
    rows=$(grep -E '^\[0\] +[0-9]+ +[0-9]+ +half +avg ' "$log" |
           awk 'NF == 15 && $10 == 0 && $14 == 0 { n++ } END { print n + 0 }')
    t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 6 ] &&
           grep -q '# Out of bounds values : 0 OK' "$log" &&
           grep -q '# Avg bus bandwidth' "$log"; echo $?) \
        "allreduce --algo $algo, half, avg: exit $rc, $rows of 6 rows exact"
    [ $rc -eq 0 ] && [ "$rows" -eq 6 ] || t_show "$log"
done
for op in reduce_scatter allgather broadcast; do
    for dt in float bfloat16; do
        take_ports "$n" || { t_ok 1 "no free ports"; continue; }
        port=$PORT
        log=$TMP/$op.$dt.log
        timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
            --join-timeout 30 --op "$op" -d "$dt" --root 2 -b 6 -e 3M -f 9 \
            -n 2 -w 1 > "$log" 2>&1
        rc=$?
        rows=$(grep -E "^\[0\] +[0-9]+ +[0-9]+ +$dt " "$log" |
               awk 'NF == 15 && $10 == 0 && $14 == 0 { n++ } END { print n + 0 }')
        t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 6 ] &&
               grep -q '# Out of bounds values : 0 OK' "$log"; echo $?) \
            "$op $dt: exit $rc, $rows of 6 rows exact"
        [ $rc -eq 0 ] && [ "$rows" -eq 6 ] || t_show "$log"
    done
done
# -t: the ranks agree on an iteration count that fills the time.
take_ports "$n"
port=$PORT
log=$TMP/timed.log
timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
    --join-timeout 30 --op allreduce -b 4K -e 64K -f 16 -n 1 -w 1 -t 0.05 \
    > "$log" 2>&1
rc=$?
rows=$(grep -E '^\[0\] +[0-9]+ +[0-9]+ +float +sum ' "$log" |
       awk 'NF == 15 && $10 == 0 && $14 == 0 { n++ } END { print n + 0 }')
t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 2 ]; echo $?) \
    "-t 0.05: exit $rc, $rows of 2 rows exact"
[ $rc -eq 0 ] && [ "$rows" -eq 2 ] || t_show "$log"
# --vs-fixed: a row per size with auto's algorithm, a time for auto and
# for each fixed algorithm it chooses from, the best one and the ratio,
# then the worst ratio.
take_ports "$n"
port=$PORT
log=$TMP/vs.log
timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
    --join-timeout 30 --op allreduce --vs-fixed -b 4K -e 1M -f 16 -n 2 -w 1 \
    > "$log" 2>&1
rc=$?
cols=$(grep -E '^\[0\] # +size +algo +auto ' "$log" | awk '{ print NF - 1 }')
rows=$(grep -E '^\[0\] +[0-9]+ +[a-z]+ +[0-9.]+ ' "$log" |
       awk -v nf="$cols" 'NF == nf && $NF + 0 > 0 { n++ } END { print n + 0 }')
t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 3 ] &&
       grep -Eq '^\[0\] # worst auto/best: [0-9.]+$' "$log" &&
       grep -q '# Out of bounds values : 0 OK' "$log"; echo $?) \
    "--vs-fixed: exit $rc, $rows of 3 rows of auto against the fixed ones"
[ $rc -eq 0 ] && [ "$rows" -eq 3 ] || t_show "$log"
# --rotate: the same rotation with every run kept: a row per size with
# each one's median, the best, auto/best and its interval (lo <= ratio <=
# hi) and a verdict; --algos picks the fixed ones.
take_ports "$n"
port=$PORT
log=$TMP/rot.log
timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
    --join-timeout 30 --op allreduce --rotate --algos ring,rd -b 4K -e 1M \
    -f 16 -n 5 -w 1 > "$log" 2>&1
rc=$?
rows=$(grep -E '^\[0\] +[0-9]+ +[a-z]+ +[0-9]+ ' "$log" |
       awk 'NF == 12 && ($8 == "ring" || $8 == "rd") && $10 <= $9 &&
            $9 <= $11 && $12 ~ /^(ok|over|\?)$/ { n++ } END { print n + 0 }')
t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 3 ] &&
       grep -Eq '^\[0\] # +size +algo +rounds +auto +ring +rd +best ' \
           "$log" &&
       grep -Eq '^\[0\] # worst auto/best: [0-9.]+ at [0-9]+;' "$log" &&
       grep -q '# Out of bounds values : 0 OK' "$log"; echo $?) \
    "--rotate --algos ring,rd: exit $rc, $rows of 3 rows with an interval"
[ $rc -eq 0 ] && [ "$rows" -eq 3 ] || t_show "$log"
# with -t: the fixed ones far behind after the first quarter sit out,
# and each row still has its interval over the rounds auto and the best
# both ran
take_ports "$n"
port=$PORT
log=$TMP/rott.log
timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
    --join-timeout 30 --op allreduce --rotate -b 4K -e 64K -f 16 -n 4 \
    -w 1 -t 0.2 > "$log" 2>&1
rc=$?
rows=$(grep -E '^\[0\] +[0-9]+ +[a-z]+ +[0-9]+ ' "$log" |
       awk '$4 >= 4 && $(NF - 3) > 0 && $(NF - 2) <= $(NF - 3) &&
            $(NF - 3) <= $(NF - 1) && $NF ~ /^(ok|over|\?)$/ { n++ }
            END { print n + 0 }')
t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 2 ] &&
       grep -q '^\[0\] # after the first quarter of the rounds' "$log" &&
       grep -q '# Out of bounds values : 0 OK' "$log"; echo $?) \
    "--rotate -t 0.2: exit $rc, $rows of 2 rows with an interval"
[ $rc -eq 0 ] && [ "$rows" -eq 2 ] || t_show "$log"
# --min-rounds: at least that many rounds a size, where -t holds fewer
take_ports "$n"
port=$PORT
log=$TMP/rotm.log
timeout 120 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
    --join-timeout 30 --op allreduce --rotate --algos ring,rd -b 4K -e 64K \
    -f 16 -n 4 -w 1 -t 0.01 --min-rounds 60 > "$log" 2>&1
rc=$?
rows=$(grep -E '^\[0\] +[0-9]+ +[a-z]+ +[0-9]+ ' "$log" |
       awk '$4 >= 60 && $(NF - 2) <= $(NF - 3) && $(NF - 3) <= $(NF - 1) &&
            $NF ~ /^(ok|over|\?)$/ { n++ } END { print n + 0 }')
t_ok $([ $rc -eq 0 ] && [ "$rows" -eq 2 ] &&
       grep -q '# Out of bounds values : 0 OK' "$log"; echo $?) \
    "--rotate -t 0.01 --min-rounds 60: exit $rc, $rows of 2 rows of 60 rounds or more"
[ $rc -eq 0 ] && [ "$rows" -eq 2 ] || t_show "$log"
"$MESHBENCH" --op allreduce --min-rounds 10 > "$TMP/badm.log" 2>&1
rc=$?
"$MESHBENCH" --op allreduce --rotate --min-rounds 4001 >> "$TMP/badm.log" 2>&1
rc2=$?
t_ok $([ $rc -eq 1 ] && [ $rc2 -eq 1 ] &&
       grep -q -- "--min-rounds needs --rotate" "$TMP/badm.log" &&
       grep -q -- "--min-rounds '4001': expected a number from 0 to 4000" \
           "$TMP/badm.log"; echo $?) \
    "--min-rounds without --rotate and past 4000 are refused (exit $rc $rc2)"
"$MESHBENCH" --op allreduce --algos ring > "$TMP/bada.log" 2>&1
rc=$?
"$MESHBENCH" --op allreduce --rotate --algos ring,tree,ring \
    >> "$TMP/bada.log" 2>&1
rc2=$?
t_ok $([ $rc -eq 1 ] && [ $rc2 -eq 1 ] &&
       grep -q -- "--algos needs --vs-fixed or --rotate" "$TMP/bada.log" &&
       grep -q -- "--algos 'ring,tree,ring': ring twice" "$TMP/bada.log"
       echo $?) "--algos alone and --algos with a repeat are refused"
"$MESHBENCH" --op allreduce -t -1 > "$TMP/badt.log" 2>&1
rc=$?
t_ok $([ $rc -eq 1 ] && grep -q "expected seconds from 0 to 3600" \
       "$TMP/badt.log"; echo $?) "-t -1 is refused (exit $rc)"
"$MESHBENCH" --op allreduce --algo fastest > "$TMP/bad.log" 2>&1
rc=$?
t_ok $([ $rc -eq 1 ] &&
       grep -q -- "--algo: unknown algorithm 'fastest'" "$TMP/bad.log"
       echo $?) "--algo fastest is refused naming the flag (exit $rc)"
"$MESHBENCH" --op allreduce --vs-fixed -n 100001 > "$TMP/badn.log" 2>&1
rc=$?
"$MESHBENCH" --op pingpong -n 1000000001 >> "$TMP/badn.log" 2>&1
rc2=$?
t_ok $([ $rc -eq 1 ] && [ $rc2 -eq 1 ] &&
       grep -q -- "-n 100001 with --vs-fixed: at most 100000" "$TMP/badn.log" &&
       grep -q -- "-n .1000000001.: expected an integer from 1 to 1000000000" \
           "$TMP/badn.log"; echo $?) \
    "-n past 10^5 with --vs-fixed and past 10^9 are refused (exit $rc $rc2)"
# The check can fail: rank 1 spoils one byte of its first input longer
# than 100 bytes; the sums come out wrong, and every rank exits 4.
take_ports "$n"
port=$PORT
log=$TMP/corrupt.log
MESHBENCH_TEST_CORRUPT=1:100 timeout 120 "$MESHRUN" -np "$n" -- \
    "$MESHBENCH" --port "$port" --join-timeout 30 --op allreduce \
    -b 6 -e 3M -f 9 -n 2 -w 1 > "$log" 2>&1
rc=$?
t_ok $([ $rc -eq 4 ] &&
       grep -Eq '# Out of bounds values : [1-9][0-9]* FAILED' "$log"
       echo $?) "a spoiled input byte: wrong values counted, exit 4 (got $rc)"
[ $rc -eq 4 ] || t_show "$log"
t_done
