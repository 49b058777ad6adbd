#!/bin/sh
# bench/sparse.sh: sparsified gradients (--compress topk:R) against fp16
# and none, on slow links: time per step and bytes per step.
#
#   bench/sparse.sh [--peers "8 32"] [--series "none fp16 topk:0.01"]
#                   [--k K] [--gbit G] [--steps S] [--warmup W]
#                   [--out DIR] [--builddir DIR]
#
# For each N, N network-namespace hosts on one bridge (scripts/netns.sh),
# one meshtrain peer per host, each host's egress shaped by tbf to
# G Gbit/s / K (default 1 Gbit/s, K = 64). Every peer runs ResNet-50, batch
# 32, with simulated compute (--simulate-compute k80, the seed's 0.705 s a
# step) and the gradients shrunk by the same K (--simulate-scale K), as
# bench/scaling does: the bandwidth terms keep their ratio to compute. The
# dense series run the ring all-reduce (--algo ring); the sparse ones
# all-gather their pairs (a ring too).
#
# Prints and writes DIR/sparse.csv (default bench/sparse-out/): one row per
# series and N with the median step time after the warmup, and the bytes
# each peer sends per step, from rank 0's timeline, scaled back by K to
# the real model (ring all-reduce: 2 (N - 1) / N of the bucket, ring
# all-gather: (N - 1) / N of what is gathered), with both ratios to none.
# Simulated compute also means simulated gradients (zeros): the top-k
# selection runs on K times fewer floats than a real step would, so it is
# not in these times (for the real 25.6 M gradients, measured here: 47 ms
# of CPU to select 1 %, about 15 more to add the residual).
# Needs root (namespaces, tc) and a built tree.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
builddir=$here
peers="8 32"
series="none fp16 topk:0.01"
k=64
gbit=1
steps=6
warmup=2
out=$here/bench/sparse-out
while [ $# -gt 0 ]; do
    case $1 in
    --peers) peers=$2; shift 2 ;;
    --series) series=$2; shift 2 ;;
    --k) k=$2; shift 2 ;;
    --gbit) gbit=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --builddir) builddir=$2; shift 2 ;;
    -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bench/sparse.sh: unknown option '$1' (see --help)" >&2
       exit 2 ;;
    esac
done
for v in $peers $steps $warmup $k $gbit; do
    case $v in
    ''|*[!0-9]*) echo "bench/sparse.sh: '$v' is not a positive integer" >&2
                 exit 2 ;;
    esac
done
meshtrain=$builddir/meshtrain
[ -x "$meshtrain" ] || { echo "bench/sparse.sh: no $meshtrain (make, or" \
                              "--builddir)" >&2; exit 1; }
"$meshtrain" --help | grep -q "topk:R" ||
    { echo "bench/sparse.sh: $meshtrain has no --compress topk" >&2; exit 1; }

BL_PREFIX=sp$(($$ % 100000))
. "$here/bench/lib.sh"
BL_RATE=$((gbit * 1000000 / k))kbit
"$BL_NETNS" check --prefix "$BL_PREFIX" >/dev/null ||
    { echo "bench/sparse.sh: network namespaces unavailable here" >&2
      exit 77; }
mkdir -p "$out/raw" || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparse.XXXXXX") || exit 1
trap 'bl_teardown; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"
iters=$((steps + warmup))

# Every host knows every other's MAC (bench/scaling: no ARP storm at 32).
static_arp() {
    _i=1
    : >"$tmp/macs"
    while [ $_i -le "$1" ]; do
        echo "10.77.0.$_i $(ip netns exec "$BL_PREFIX$_i" \
            cat /sys/class/net/eth0/address)" >>"$tmp/macs"
        _i=$((_i + 1))
    done
    _i=1
    while [ $_i -le "$1" ]; do
        awk -v me="10.77.0.$_i" '$1 != me { print "neigh replace " $1 \
            " lladdr " $2 " dev eth0 nud permanent" }' "$tmp/macs" \
            >"$tmp/neigh"
        ip -n "$BL_PREFIX$_i" -batch "$tmp/neigh" || return 1
        _i=$((_i + 1))
    done
}

# run_point SERIES N: raw/N-SERIES/ with rank 0's metrics and timeline.
run_point() {
    _s=$1 _n=$2
    _d=$out/raw/$_n-$(echo "$_s" | tr ':,' '__')
    rm -rf "$_d"
    mkdir -p "$_d"
    bl_hostfile "$_d/hostfile" "$_n"
    _lim=$((120 + 2 * _n + iters * (4 + _n / 4)))
    _r=0
    while [ $_r -lt "$_n" ]; do
        _extra=
        [ $_r -eq 0 ] && _extra="--metrics $_d/metrics.jsonl
            --timeline $_d/timeline.json --timeline-steps $iters"
        # shellcheck disable=SC2086
        bl_bg $((_r + 1)) env MESHTRAIN_LOG="${MESHTRAIN_LOG:-warn}" \
            OMP_NUM_THREADS=1 timeout "$_lim" "$meshtrain" \
            --hostfile "$_d/hostfile" --rank $_r --port "$BL_PORT" \
            --secret-file "$tmp/secret" --join-timeout $((60 + 2 * _n)) \
            --peer-timeout $((30 + _n)) --model resnet50 --batch 32 \
            --simulate-compute k80 --simulate-scale "$k" \
            --iters "$iters" --algo ring --compress "$_s" --verify-every 0 \
            --quiet $_extra >"$_d/rank$_r.out" 2>&1
        _r=$((_r + 1))
    done
    bl_wait_bg $((_lim + 10))
    _rc=$?
    echo "$_rc" >"$_d/rc"
    bl_log "  N=$_n $_s: rc $_rc"
}

bl_log "sparse: peers '$peers', series '$series', $steps steps after" \
       "$warmup, k = $k, tbf $BL_RATE per host, $(nproc) cores"
for n in $peers; do
    bl_setup c "$n" || { bl_log "cannot make $n hosts"; continue; }
    static_arp "$n" || { bl_log "cannot set static ARP entries"; continue; }
    for s in $series; do
        run_point "$s" "$n"
    done
    bl_teardown
done

/usr/bin/python3 - "$out" "$k" "$warmup" "$peers" "$series" <<'PY'
import json, os, statistics, sys
out, k, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
peers, series = sys.argv[4].split(), sys.argv[5].split()
rows = []
for n in map(int, peers):
    base = None
    for s in series:
        d = os.path.join(out, "raw", "%d-%s" % (n, s.replace(":", "_")
                                                .replace(",", "_")))
        try:
            rc = int(open(os.path.join(d, "rc")).read())
            m = [json.loads(l) for l in open(os.path.join(d,
                                                          "metrics.jsonl"))]
            ev = json.load(open(os.path.join(d,
                                             "timeline.json")))["traceEvents"]
        except (OSError, ValueError) as e:
            print("# N=%d %s: no result (%s)" % (n, s, e), file=sys.stderr)
            continue
        t = statistics.median(r["t_step"] for r in m if r["step"] > warmup)
        sent, nsteps = 0.0, set()
        for e in ev:
            if e.get("ph") != "X" or e["args"].get("step", -1) < warmup:
                continue
            if e["name"].startswith("allreduce"):
                f = 2.0 * (n - 1) / n
            elif e["name"].startswith("allgather sparse"):
                f = (n - 1) / n
            else:
                continue
            nsteps.add(e["args"]["step"])
            sent += e["args"]["bytes"] * f
        b = sent / max(len(nsteps), 1) * k / 1e6
        if s == "none":
            base = (t, b)
        rows.append((n, s, rc, t, b, base[0] / t if base else float("nan"),
                     b / base[1] if base and base[1] else float("nan")))
with open(os.path.join(out, "sparse.csv"), "w") as f:
    f.write("peers,series,rc,t_step_s,mb_sent_per_peer_step,"
            "speedup_vs_none,bytes_vs_none\n")
    for r in rows:
        f.write("%d,%s,%d,%.4f,%.2f,%.3f,%.4f\n" % r)
print("%5s %-16s %3s %9s %12s %9s %9s" % ("peers", "series", "rc",
                                           "s/step", "MB/step", "speedup",
                                           "bytes"))
for r in rows:
    print("%5d %-16s %3d %9.3f %12.2f %8.2fx %8.3fx" % r)
PY
