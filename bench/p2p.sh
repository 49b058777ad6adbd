#!/bin/sh
# p2p.sh: the mesh issue's point-to-point goals, on two network-namespace
# hosts (scripts/netns.sh) joined by one bridge:
#   - meshbench --op stream throughput against iperf3's single stream on
#     the same link (goal: ratio >= 0.90);
#   - meshbench --op pingpong small-message round trip (2 x lat_us, since
#     meshbench's lat_us is half the round trip) against ping's RTT (goal:
#     ratio <= 2).
#
#   bench/p2p.sh [--builddir DIR] [--out DIR] [--time S] [--repeat R]
#                [--prefix P] [--rate R] [--insecure] [-- MESHBENCH-ARGS...]
#
# --time S: iperf3 duration (default 3, plus 1 s of slow start omitted).
# --repeat R: everything R times in turn; each measurement's best is kept
# (default 1).
# --rate R shapes both hosts' egress with tbf (default unshaped).
# MESHBENCH-ARGS go to both meshbench runs (e.g. --streams 2 -n 50).
# Without a meshbench that knows --op stream, it says so and measures
# iperf3 and ping alone.
#
# Writes DIR/p2p.csv (metric,value,unit; DIR defaults to bench/out) and
# DIR/raw/p2p-*, and prints the two ratios. Needs root.

set -u
. "$(dirname "$0")/lib.sh"

outdir="$bl_srcdir/bench/out"
builddir=${top_builddir:-$bl_srcdir}
secs=3
repeat=1
insecure=0
BL_RATE= # unshaped unless --rate
while [ $# -gt 0 ]; do
    case $1 in
        --) shift; break ;;
        -h|--help) bl_help; exit 0 ;;
        *) bl_opt "--builddir --out --time --repeat --prefix --rate \
--insecure" "$@" ||
               { echo "p2p.sh: unknown argument '$1' (see --help)" >&2
                 exit 2; }
           shift "$BL_SHIFT" ;;
    esac
done
case $repeat in ''|*[!0-9]*|0) echo "p2p.sh: bad --repeat '$repeat'" >&2
                             exit 2 ;; esac
command -v iperf3 >/dev/null ||
    bl_die "iperf3 not found (apt-get install iperf3)"
command -v ping >/dev/null ||
    bl_die "ping not found (apt-get install iputils-ping)"
why=$("$BL_NETNS" check --prefix "$BL_PREFIX") || bl_die "$why"

meshbench="$builddir/meshbench"
mesh=0
bl_meshbench_has "$meshbench" stream "measuring iperf3 and ping only" &&
    mesh=1

mkdir -p "$outdir/raw" || exit 1
tmp=$(mktemp -d /tmp/p2p.XXXXXX) || exit 1
cleanup() {
    bl_teardown
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
status=0

if [ -n "$BL_RATE" ]; then
    bl_setup c 2 || exit 1
else
    bl_setup b 2 || exit 1
fi

# meshbench OP B E F LOG [ARGS]: two ranks, one per host; rank 0's table.
run_mesh() {
    _op=$1 _b=$2 _e=$3 _f=$4 _log=$5
    shift 5
    bl_hostfile "$tmp/hostfile" 2
    if [ $insecure -eq 1 ]; then
        set -- --insecure "$@"
    else
        ( umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' \
            >"$tmp/secret" ) || return 1
        set -- --secret-file "$tmp/secret" "$@"
    fi
    for _r in 0 1; do
        bl_bg $((_r + 1)) timeout 300 "$meshbench" --hostfile "$tmp/hostfile" \
            --rank $_r --port $((BL_PORT + 10)) --op "$_op" \
            -b "$_b" -e "$_e" -f "$_f" "$@" >"$tmp/mesh.$_r" 2>&1
    done
    bl_wait_bg 310
    _rc=$?
    cat "$tmp/mesh.0" >"$_log"
    sed 's/^/[rank 1] /' "$tmp/mesh.1" >>"$_log"
    [ $_rc -eq 0 ] || bl_log "meshbench --op $_op failed: see $_log"
    return $_rc
}

# Rows "size lat_us GBps" of meshbench's table (columns found by name).
mesh_rows() {
    awk -v op="$2" '
        /^#/ && /size/ && /lat_us/ && !hdr {
            line = $0; sub(/^#/, "", line); nf = split(line, h, " ");
            for (k = 1; k <= nf; k++) {
                if (h[k] == "op") co = k; if (h[k] == "size") cs = k;
                if (h[k] == "lat_us") cl = k; if (h[k] == "GB/s") cg = k;
            }
            hdr = 1; next }
        /^#/ || /^\[rank/ || NF == 0 { next }
        hdr && (!co || $co == op) && $cs ~ /^[0-9]+$/ { print $cs, $cl, $cg }
    ' "$1"
}

# Every measurement, repeat times, interleaved; the best of each is kept.
: >"$tmp/iperf" >"$tmp/ping" >"$tmp/stream" >"$tmp/pingpong"
r=1
while [ $r -le "$repeat" ]; do
    [ "$repeat" -gt 1 ] && bl_log "repetition $r of $repeat"
    bl_load
    # iperf3, one stream, host 1 -> host 2.
    bl_bg 2 iperf3 -s -1 -p $((BL_PORT + 1)) >/dev/null 2>&1
    sleep 0.5
    bl_exec 1 iperf3 -c "$(bl_addr 2)" -p $((BL_PORT + 1)) -t "$secs" -O 1 \
        --connect-timeout 3000 -J >"$outdir/raw/p2p-r$r-iperf3.json" 2>&1
    bl_wait_bg 5 || true
    python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("%.4f" % (d["end"]["sum_received"]["bits_per_second"] / 8e9))
except Exception as e:
    sys.stderr.write("p2p.sh: iperf3: %s\n" % e)' \
        "$outdir/raw/p2p-r$r-iperf3.json" >>"$tmp/iperf"

    log="$outdir/raw/p2p-r$r-ping.txt"
    bl_exec 1 ping -c 200 -i 0.01 "$(bl_addr 2)" >"$log" 2>&1
    awk -F/ '/^rtt|^round-trip/ { split($4, a, "= ");
             printf "%.1f %.1f\n", $5 * 1000, a[2] * 1000 }' "$log" \
        >>"$tmp/ping"

    if [ $mesh -eq 1 ]; then
        log="$outdir/raw/p2p-r$r-mesh-stream.txt"
        run_mesh stream 64K 64M 4 "$log" "$@" </dev/null || status=1
        mesh_rows "$log" stream >>"$tmp/stream"
        log="$outdir/raw/p2p-r$r-mesh-pingpong.txt"
        run_mesh pingpong 8 4K 8 "$log" "$@" </dev/null || status=1
        mesh_rows "$log" pingpong >>"$tmp/pingpong"
    fi
    r=$((r + 1))
done

iperf=$(awk 'NR == 1 || $1 > m { m = $1 } END { print (NR ? m : "nan") }' \
        "$tmp/iperf")
rtt=$(awk 'NR == 1 || $1 < m { m = $1 } END { print (NR ? m : "nan") }' \
      "$tmp/ping")
rttmin=$(awk 'NR == 1 || $2 < m { m = $2 } END { print (NR ? m : "nan") }' \
         "$tmp/ping")
# Best per size: highest GB/s for stream, lowest lat_us for ping-pong.
awk '!($1 in g) || $3 > g[$1] { g[$1] = $3; l[$1] = $2 }
     END { for (s in g) print s, l[s], g[s] }' "$tmp/stream" |
    sort -n >"$tmp/stream.best"
awk '!($1 in l) || $2 < l[$1] { l[$1] = $2; g[$1] = $3 }
     END { for (s in l) print s, l[s], g[s] }' "$tmp/pingpong" |
    sort -n >"$tmp/pingpong.best"

csv="$outdir/p2p.csv"
{
    echo "metric,value,unit"
    echo "iperf3_single_stream,$iperf,GB/s"
    echo "ping_rtt_avg,$rtt,us"
    echo "ping_rtt_min,$rttmin,us"
} >"$csv"

[ "$repeat" -gt 1 ] && echo "best of $repeat repetitions"
echo "iperf3 single stream, host 1 -> host 2: $iperf GB/s"
echo "ping RTT host 1 -> host 2: avg $rtt us, min $rttmin us"

if [ $mesh -eq 1 ]; then
    if [ ! -s "$tmp/stream.best" ] || [ ! -s "$tmp/pingpong.best" ]; then
        bl_log "meshbench printed no table: see $outdir/raw/p2p-*-mesh-*.txt"
        status=1
    fi
    while read -r size lat gbps; do
        echo "meshbench_stream_$size,$gbps,GB/s" >>"$csv"
    done <"$tmp/stream.best"
    while read -r size lat gbps; do
        echo "meshbench_pingpong_rtt_$size,$(awk -v l="$lat" \
            'BEGIN { printf "%.2f", 2 * l }'),us" >>"$csv"
    done <"$tmp/pingpong.best"
    echo
    echo "meshbench stream (GB/s) against iperf3's single stream" \
         "(goal >= 0.90):"
    awk -v ip="$iperf" '{ printf "  %10d B  %8.4f GB/s  ratio %.2f\n",
                          $1, $3, (ip > 0 ? $3 / ip : 0) }' "$tmp/stream.best"
    echo "meshbench ping-pong round trip (2 x lat_us) against ping's" \
         "mean RTT (goal <= 2):"
    awk -v r="$rtt" '{ printf "  %10d B  %8.1f us  ratio %.2f\n",
                       $1, 2 * $2, (r > 0 ? 2 * $2 / r : 0) }' \
        "$tmp/pingpong.best"
fi
echo
echo "wrote $csv"
exit $status
