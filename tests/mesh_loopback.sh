#!/bin/sh
# tests/mesh_loopback.sh: 2, 4 and 8 peers on loopback, started by meshrun,
# join the mesh and run meshbench over every pair of ranks (--all-pairs:
# ping-pong, and streaming both ways) at odd sizes from 3 bytes to 2.3 MB;
# every received byte is checked by the receiver, and any wrong byte or
# error fails the rank and so meshrun.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 19
for n in 2 4 8; do
    take_ports "$n" || { t_ok 1 "no free ports for $n peers"; continue; }
    port=$PORT
    log=$TMP/loop$n.log
    timeout 300 "$MESHRUN" -np "$n" -- "$MESHBENCH" --port "$port" \
        --join-timeout 30 --all-pairs --op all -b 3 -e 3M -f 7 -n 2 -w 1 \
        > "$log" 2>&1
    rc=$?
    t_ok $rc "$n peers: meshrun + meshbench exit 0 (got $rc)"
    [ $rc -eq 0 ] || t_show "$log"
    # 8 sizes: 3, 21, ..., 2470629
    all_pairs_ok "$log" "$n" 8 "$n peers"
done

# IPv6 loopback, several TCP streams per link (messages striped over them).
take_ports 4
port=$PORT
log=$TMP/v6.log
timeout 300 "$MESHRUN" -H '[::1]:4' -- "$MESHBENCH" --port "$port" \
    --streams 3 --join-timeout 30 --all-pairs --op all -b 3 -e 3M -f 7 \
    -n 2 -w 1 > "$log" 2>&1
rc=$?
t_ok $rc "4 peers on [::1], --streams 3, every pair: exit 0 (got $rc)"
[ $rc -eq 0 ] || t_show "$log"
rows=$(grep -Ec '^\[0\] +(pingpong|stream) ' "$log")
t_ok $([ "$rows" -eq 48 ] && grep -q '3 stream(s) per link' "$log"; echo $?) \
    "[::1]: $rows table rows (want 48), 3 streams per link"

# The check can fail: rank 0 spoils one byte of its first message longer
# than 1000 bytes; rank 1 must find exactly that byte and meshrun exit 4.
take_ports 2
port=$PORT
log=$TMP/corrupt.log
MESHBENCH_TEST_CORRUPT=0:1000 timeout 120 "$MESHRUN" -np 2 -- "$MESHBENCH" \
    --port "$port" --op all -b 8 -e 64K -f 8 -n 2 -w 1 > "$log" 2>&1
rc=$?
t_ok $([ $rc -eq 4 ]; echo $?) "a spoiled byte: meshrun exits 4 (got $rc)"
t_ok $(grep -q "^\[1\] .*wrong data from rank 0: 1 of 4096 bytes differ .*first at offset 1000" "$log"; echo $?) \
    "the receiver names the sender, the size and the offset"
grep "wrong data" "$log" | sed 's/^/# /'

# --tcp-congestion: every rank's streams run the congestion control asked
# for (read back from a connected stream), one other than the host's
# default, so that the check can fail; without it, the default is named.
def=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null)
cc=reno
[ "$def" = reno ] && cc=cubic
take_ports 2
port=$PORT
log=$TMP/cc.log
timeout 120 "$MESHRUN" -np 2 -- "$MESHBENCH" --port "$port" \
    --tcp-congestion "$cc" --op all -b 8 -e 1M -f 32 -n 2 -w 1 > "$log" 2>&1
rc=$?
t_ok $rc "--tcp-congestion $cc (host: ${def:-unknown}): exit 0 (got $rc)"
[ $rc -eq 0 ] || t_show "$log"
n=$(grep -c "tcp: congestion control $cc (--tcp-congestion)" "$log")
t_ok $([ "$n" -eq 2 ]; echo $?) "both ranks' streams run $cc ($n ranks say so)"
take_ports 2
port=$PORT
log=$TMP/ccdef.log
timeout 120 "$MESHRUN" -np 2 -- "$MESHBENCH" --port "$port" \
    --tcp-congestion host --op pingpong -b 8 -e 8 -n 2 -w 1 > "$log" 2>&1
n=$(grep -c "tcp: congestion control $def (this host's default" "$log")
t_ok $([ -n "$def" ] && [ "$n" -eq 2 ]; echo $?) \
    "with host, both ranks name the host's default, ${def:-unknown} ($n do)"
# Without it: cubic, the mesh's default, where this process may set it.
take_ports 2
port=$PORT
log=$TMP/ccmesh.log
timeout 120 "$MESHRUN" -np 2 -- "$MESHBENCH" --port "$port" \
    --op pingpong -b 8 -e 8 -n 2 -w 1 > "$log" 2>&1
cc_lists
want="$def (this host's default"
case " $CC_AVAIL " in *" cubic "*)
    case " $CC_ALLOWED " in
        *" cubic "*) want="cubic (the mesh's default" ;;
        *) [ "$(id -u)" -ne 0 ] || want="cubic (the mesh's default" ;;
    esac ;;
esac
n=$(grep -c "tcp: congestion control $want" "$log")
t_ok $([ "$n" -eq 2 ]; echo $?) \
    "without it, both ranks name $want) ($n do)"

# A congestion control the kernel has but does not allow an unprivileged
# process: a usage error (exit 1) before joining, naming the allowed ones.
cc_lists
avail=$CC_AVAIL allowed=$CC_ALLOWED banned=$CC_BANNED
if [ -z "$banned" ]; then
    t_skip "every available congestion control is allowed here ($avail)"
    t_skip "(the same)"
elif [ "$(id -u)" -ne 0 ] ||
     ! setpriv --reuid=65534 --regid=65534 --clear-groups \
         test -x "$MESHBENCH" 2>/dev/null; then
    t_skip "needs root, and a meshbench that user 65534 can run"
    t_skip "(the same)"
else
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$MESHBENCH" \
          -H 127.0.0.1:2 --rank 0 --insecure --tcp-congestion "$banned" \
          --join-timeout 5 2>&1)
    rc=$?
    t_ok $([ $rc -eq 1 ]; echo $?) \
        "$banned (not allowed), unprivileged: exit 1 (got $rc)"
    echo "$out" | grep -q "congestion control '$banned': not allowed for \
this process (allowed: $allowed;"
    t_ok $? "the error names the allowed ones"
    echo "$out" | sed 's/^/# /'
fi
t_done
