#!/bin/sh
# tcp_limit.sh: the "TCP limit" of a bench setting, as bench/collectives.sh
# compares against it: what TCP carries when every link of a ring carries
# traffic at once.
#
#   bench/tcp_limit.sh --setting a|b|c --np N [--time S] [--no-setup]
#                      [--prefix P] [--rate R] [--mtu M] [--cc CC]
#                      [--mesh-cc CC] [--port BASE]
#
# Measures, in this order and each alone:
#   ring    N iperf3 streams at once, host i sending to host i+1 (mod N);
#           per-link mean and minimum
#   bidir   (N = 2 only) iperf3 --bidir host 1 <-> host 2; mean per direction
#   single  one iperf3 stream alone, host 1 -> host 2 (loopback: to itself)
#   ping    ping's mean RTT host 1 -> host 2 (50 pings, 10 ms apart)
# and prints "key value" lines (GB = 1e9 bytes):
#   ring_link_GBps  ring_min_GBps  bidir_dir_GBps  single_GBps  ping_rtt_us
#   stream_cc       SENDER/RECEIVER: the congestion control of the single
#                   stream's two ends, as iperf3 reports them
#   limit_GBps      bidir_dir_GBps for N = 2, else ring_link_GBps (and
#                   always under --mesh-cc: see the bidir step)
#   ring_busy_pct ring_user_pct ring_steal_pct ring_steal_max_pct (and
#                   bidir_*): the machine's CPU during that measurement
#                   (bench/lib.sh's bl_cpu_stop: busy and user-space share
#                   of the time the hypervisor left it, steal the share
#                   it took, and its worst half second)
#   limit_busy_pct ... limit_steal_max_pct: the same for the measurement
#                   that gave limit_GBps
# Each iperf3 run lasts S seconds (--time, default 2) after one omitted
# second of slow start.
# Settings: a loopback, b N netns hosts, c N netns hosts with tbf egress
# at R (default 1gbit). Without --no-setup it creates the namespaces
# (scripts/netns.sh, prefix P, default mb<pid>; --cc CC: each defaults to
# TCP congestion control CC) and removes them on exit;
# with it, they must exist already (bench/collectives.sh does that).
# --mesh-cc CC: every iperf3 stream uses congestion control CC (iperf3 -C,
# both ends), as meshbench --tcp-congestion CC does, in any setting.

set -u
. "$(dirname "$0")/lib.sh"

setting=
np=
secs=2
setup=1
port=$BL_PORT
while [ $# -gt 0 ]; do
    case $1 in
        --setting) setting=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        --no-setup) setup=0; shift ;;
        --port) port=$2; shift 2 ;;
        -h|--help) bl_help; exit 0 ;;
        *) bl_opt "--time --prefix --rate --mtu --cc --mesh-cc" "$@" ||
               { echo "tcp_limit.sh: unknown argument '$1' (see --help)" >&2
                 exit 2; }
           shift "$BL_SHIFT" ;;
    esac
done
case $setting in a|b|c) ;; *) echo "tcp_limit.sh: --setting a|b|c" >&2
                              exit 2 ;; esac
case $np in ''|*[!0-9]*) echo "tcp_limit.sh: --np N (N >= 2)" >&2
                         exit 2 ;; esac
[ "$np" -ge 2 ] || { echo "tcp_limit.sh: --np must be >= 2" >&2; exit 2; }
[ $setup -eq 0 ] || bl_cc_check "$setting"
ccopt=${BL_MESH_CC:+-C $BL_MESH_CC}
command -v iperf3 >/dev/null ||
    bl_die "iperf3 not found (apt-get install iperf3)"

tmp=$(mktemp -d /tmp/tcp_limit.XXXXXX) || exit 1
cleanup() {
    bl_cpu_abort
    bl_kill_bg
    [ $setup -eq 1 ] && bl_teardown
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ $setup -eq 1 ]; then
    bl_setup "$setting" "$np" || exit $?
else
    BL_SETTING=$setting BL_NP=$np
fi

# GB/s received, from iperf3's JSON; FIELD is sum_received or
# sum_received_bidir_reverse.
gbps() {
    python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("%.4f" % (d["end"][sys.argv[2]]["bits_per_second"] / 8e9))
except Exception as e:
    sys.stderr.write("tcp_limit.sh: %s: %s\n" % (sys.argv[1], e))
    print("nan")
' "$1" "$2"
}

# cpu_keys PREFIX "BUSY USER STEAL STEAL_MAX": bl_cpu_stop's numbers as
# PREFIX_busy_pct ... PREFIX_steal_max_pct lines.
cpu_keys() {
    echo "$2" | awk -v p="$1" '{
        printf "%s_busy_pct %s\n%s_user_pct %s\n", p, $1, p, $2
        printf "%s_steal_pct %s\n%s_steal_max_pct %s\n", p, $3, p, $4 }'
}

# server I: a one-off iperf3 server on host I, port base+I.
server() {
    bl_bg "$1" iperf3 -s -1 -p $((port + $1)) >/dev/null 2>&1
}

# ring: host i -> host i%N+1, all at once.
i=1
while [ "$i" -le "$np" ]; do
    server "$i"
    i=$((i + 1))
done
sleep 0.5
bl_cpu_start "$tmp/cpu-ring.txt"
pids=
i=1
while [ "$i" -le "$np" ]; do
    j=$((i % np + 1))
    bl_exec "$i" iperf3 -c "$(bl_addr $j)" -p $((port + j)) -t "$secs" -O 1 \
        $ccopt --connect-timeout 3000 -J >"$tmp/ring$i.json" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
done
for p in $pids; do wait "$p"; done
cpu=$(bl_cpu_stop "$tmp/cpu-ring.txt")
bl_wait_bg 5 || true
sum=0
min=
i=1
while [ "$i" -le "$np" ]; do
    v=$(gbps "$tmp/ring$i.json" sum_received)
    sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { print a + b }')
    min=$(awk -v a="${min:-$v}" -v b="$v" 'BEGIN { print (b < a ? b : a) }')
    i=$((i + 1))
done
ring=$(awk -v s="$sum" -v n="$np" 'BEGIN { printf "%.4f\n", s / n }')
echo "ring_link_GBps $ring"
echo "ring_min_GBps $min"
cpu_keys ring "$cpu"
limit=$ring
limcpu=$cpu

if [ "$np" -eq 2 ]; then
    server 2
    sleep 0.5
    bl_cpu_start "$tmp/cpu-bidir.txt"
    bl_exec 1 iperf3 -c "$(bl_addr 2)" -p $((port + 2)) -t "$secs" -O 1 \
        $ccopt --bidir --connect-timeout 3000 -J >"$tmp/bidir.json" 2>&1
    cpu=$(bl_cpu_stop "$tmp/cpu-bidir.txt")
    bl_wait_bg 5 || true
    up=$(gbps "$tmp/bidir.json" sum_received)
    down=$(gbps "$tmp/bidir.json" sum_received_bidir_reverse)
    bidir=$(awk -v a="$up" -v b="$down" \
            'BEGIN { printf "%.4f\n", (a + b) / 2 }')
    echo "bidir_dir_GBps $bidir"
    cpu_keys bidir "$cpu"
    # Under --mesh-cc the ring's two streams (both dialed with -C) are the
    # limit: iperf3's server sets -C on --bidir's reverse stream only
    # after accept(), when the host's bbr has started and left its pacing
    # on (measured: a third of the forward stream's rate).
    if [ -z "$BL_MESH_CC" ]; then
        limit=$bidir
        limcpu=$cpu
    fi
fi

server 2
sleep 0.5
bl_exec 1 iperf3 -c "$(bl_addr 2)" -p $((port + 2)) -t "$secs" -O 1 \
    $ccopt --connect-timeout 3000 -J >"$tmp/single.json" 2>&1
bl_wait_bg 5 || true
echo "single_GBps $(gbps "$tmp/single.json" sum_received)"
# the congestion control iperf3 says its streams ran, sender and receiver
python3 -c '
import json, sys
try:
    e = json.load(open(sys.argv[1]))["end"]
    print("stream_cc %s/%s" % (e["sender_tcp_congestion"],
                               e["receiver_tcp_congestion"]))
except Exception:
    print("stream_cc unknown")
' "$tmp/single.json"

rtt=$(bl_exec 1 ping -q -c 50 -i 0.01 "$(bl_addr 2)" 2>/dev/null |
      awk -F/ '/^rtt|^round-trip/ { printf "%.1f\n", $5 * 1000 }')
echo "ping_rtt_us ${rtt:-nan}"
echo "limit_GBps $limit"
# the machine's CPU while the limit's measurement ran
cpu_keys limit "$limcpu"
