#!/bin/sh
# bench/verbs-hw.sh: the verbs transport on real RDMA NICs, against the
# goals: all-reduce bus bandwidth >= 94 % of the link rate at >= 64 MiB, and
# 8-byte all-reduce latency <= 5 us, on 2 peers. Run it on both machines at
# once (rank 0 prints the verdict):
#
#   bench/verbs-hw.sh RANK HOST0 HOST1 [--ib-dev DEV] [--gid-index N]
#                     [--secret-file F] [--build DIR]
#
# HOST0/HOST1: the addresses of the two machines on the network that
# carries the TCP mesh (the join and control); RDMA uses the NIC's own GID.
# Steps: perftest's ib_write_bw between the two (the link's practical
# rate; skipped without perftest), the rate the port reports in sysfs, then
# meshbench all-reduce over verbs at 64, 128 and 256 MiB and at 8 bytes.
set -eu
[ $# -ge 3 ] || { sed -n 2,16p "$0"; exit 1; }
RANK=$1 H0=$2 H1=$3
shift 3
DEV='' GIDX='' SECRET=''
BUILD=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
    case $1 in
    --ib-dev) DEV=$2; shift 2 ;;
    --gid-index) GIDX=$2; shift 2 ;;
    --secret-file) SECRET=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "verbs-hw.sh: unknown option $1" >&2; exit 1 ;;
    esac
done
MB=$BUILD/meshbench
[ -x "$MB" ] || { echo "verbs-hw.sh: $MB not built" >&2; exit 1; }
if [ -z "$DEV" ]; then
    DEV=$(ibv_devices 2>/dev/null | awk 'NR > 2 { print $1; exit }')
fi
[ -n "$DEV" ] || { echo "verbs-hw.sh: no RDMA device (ibv_devices)" >&2; exit 1; }
PORT=1
RATE_FILE=/sys/class/infiniband/$DEV/ports/$PORT/rate
RATE_GBPS=$(awk '{ print $1 }' "$RATE_FILE" 2>/dev/null || echo 0)

MESH="-H $H0:1,$H1:1 --rank $RANK --transport verbs --ib-dev $DEV"
[ -n "$GIDX" ] && MESH="$MESH --gid-index $GIDX"
if [ -n "$SECRET" ]; then MESH="$MESH --secret-file $SECRET"; else MESH="$MESH --insecure"; fi
OUT=${TMPDIR:-/tmp}/verbs-hw.$$
mkdir -p "$OUT"

# 1. perftest: the link's practical one-way RDMA write rate.
WBW=
if command -v ib_write_bw >/dev/null 2>&1; then
    PT="-d $DEV -s 8388608 -n 200 -F --report_gbits"
    [ -n "$GIDX" ] && PT="$PT -x $GIDX"
    if [ "$RANK" = 1 ]; then
        # shellcheck disable=SC2086
        ib_write_bw $PT >"$OUT/ib_write_bw" 2>&1 || true
    else
        sleep 2
        # shellcheck disable=SC2086
        ib_write_bw $PT "$H1" >"$OUT/ib_write_bw" 2>&1 || true
        # columns: bytes iterations BW_peak BW_average MsgRate
        WBW=$(awk '$1 == 8388608 { print $4 }' "$OUT/ib_write_bw")
    fi
    sleep 2
fi

# 2. bandwidth: busbw (nccl-tests' column) at 64..256 MiB.
# shellcheck disable=SC2086
"$MB" $MESH --op allreduce -b 64M -e 256M -f 2 -n 20 -w 5 >"$OUT/bw" 2>&1
# 3. latency: 8-byte all-reduce, many iterations.
# shellcheck disable=SC2086
"$MB" $MESH --op allreduce -b 8 -e 8 -n 10000 -w 100 >"$OUT/lat" 2>&1
[ "$RANK" = 0 ] || exit 0

echo "verbs-hw: $DEV port $PORT, sysfs rate ${RATE_GBPS} Gb/s, ib_write_bw ${WBW:-n/a} Gb/s"
echo "--- meshbench all-reduce (bandwidth)"; grep -v '^\[' "$OUT/bw" | tail -n 6
echo "--- meshbench all-reduce (8 bytes)"; grep -v '^\[' "$OUT/lat" | tail -n 3
# The header row names the columns; busbw and time are found by name.
col() { awk -v want="$2" '
    /^#/ { for (i = 1; i <= NF; i++) if ($i == want) c = i - 1 }
    c && $1 ~ /^[0-9]+$/ { v = $(c); if (v + 0 > best + 0 || best == "") best = v }
    END { print best }' "$1"; }
BUSBW=$(col "$OUT/bw" busbw)     # GB/s
LAT=$(awk '/^#/ { for (i = 1; i <= NF; i++) if ($i == "time" || $i == "time_us") c = i - 1 }
           c && $1 == 8 { print $(c); exit }' "$OUT/lat")
awk -v bw="$BUSBW" -v rate="$RATE_GBPS" -v wbw="${WBW:-0}" -v lat="$LAT" 'BEGIN {
    gbps = bw * 8
    if (rate > 0) printf "busbw %.2f GB/s = %.1f Gb/s = %.1f %% of the link rate (goal 94 %%): %s\n", bw, gbps, 100 * gbps / rate, (gbps >= 0.94 * rate) ? "MET" : "MISSED"
    if (wbw > 0) printf "busbw / ib_write_bw = %.1f %%\n", 100 * gbps / wbw
    if (lat != "") printf "8-byte all-reduce %s us (goal 5 us): %s\n", lat, (lat + 0 <= 5) ? "MET" : "MISSED"
}'
echo "raw output in $OUT"
