#!/bin/sh
# bench/elastic_cost.sh: what --elastic costs when nothing fails (run by
# hand; issue 25's goal: at most 1 % of the step time).
#
#   bench/elastic_cost.sh [--pairs K] [--peers N] [--iters I] [--width W]
#                         [--image-size S] [--batch B] [--out DIR]
#
# N peers (default 4) on loopback train a ResNet-18 (--width, default 8,
# CIFAR stem) on synthetic data for --iters steps (default 150), K times
# (default 5) without --elastic and K times with it, interleaved (plain
# first in odd pairs, elastic first in even ones), so that the load of a
# shared machine falls on both alike. It reports, for each mode, the mean
# and spread (sample standard deviation) over the runs of:
#   - the wall time per step of the whole run (startup included, the same
#     for both), and
#   - the mean step time of rank 0's metrics (t_step; with --elastic it
#     includes the snapshot);
# and, measured inside the elastic runs, which noise does not swamp:
#   - the snapshot's share of the step time: rank 0's t_snapshot (what is
#     copied at the step's start: the BN statistics and the data position;
#     on the cpu backend the weights and momentum are kept by the update
#     in its own pass) plus the update's extra time (the mean optimizer
#     time of rank 0's --timeline in the elastic runs less that of the
#     plain runs), over t_step, and
#   - the CPU time of each peer's view thread (its UDP socket and the
#     agreement), against the run's time.
# Writes DIR/runs.csv and DIR/summary.txt (default DIR=bench-elastic-out).
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
MESHTRAIN=${MESHTRAIN:-$top/meshtrain}
PAIRS=5
NP=4
ITERS=150
WIDTH=8
SIZE=14
BATCH=8
OUT=bench-elastic-out
while [ $# -gt 0 ]; do
    case $1 in
    --pairs) PAIRS=$2 ;;
    --peers) NP=$2 ;;
    --iters) ITERS=$2 ;;
    --width) WIDTH=$2 ;;
    --image-size) SIZE=$2 ;;
    --batch) BATCH=$2 ;;
    --out) OUT=$2 ;;
    *) echo "usage: bench/elastic_cost.sh [--pairs K] [--peers N]" \
            "[--iters I] [--width W] [--image-size S] [--batch B]" \
            "[--out DIR]" >&2
       exit 2 ;;
    esac
    shift 2
done
[ -x "$MESHTRAIN" ] || { echo "elastic_cost.sh: build meshtrain first" >&2
                         exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PORT=${BL_PORT:-$((10000 + ($$ % 190) * 100))}
head -c 32 /dev/urandom | base64 > "$OUT/secret"
chmod 600 "$OUT/secret"
export OMP_WAIT_POLICY=passive MESHTRAIN_LOG=debug
PIDS=""
cleanup() {
    for p in $PIDS; do kill -KILL "$p" 2> /dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# one NAME FLAGS...: a run of NP peers; its wall time into NAME.time
one() {
    _name=$1
    shift
    PIDS=""
    _t0=$(date +%s.%N)
    _r=0
    while [ $_r -lt "$NP" ]; do
        "$MESHTRAIN" -H "localhost:$NP" --rank $_r --port "$PORT" \
            --secret-file "$OUT/secret" --model resnet18 --width "$WIDTH" \
            --cifar-stem --image-size "$SIZE" --in-channels 1 \
            --num-classes 10 --data synthetic:4000 --threads 1 \
            --data-threads 1 --batch "$BATCH" --iters "$ITERS" --no-eval \
            --quiet --metrics "$OUT/$_name.metrics" \
            $([ $_r -eq 0 ] && echo "--timeline $OUT/$_name.tl.json" \
              "--timeline-steps $ITERS") "$@" \
            > "$OUT/$_name.p$_r.log" 2>&1 &
        PIDS="$PIDS $!"
        _r=$((_r + 1))
    done
    _bad=0
    for p in $PIDS; do wait "$p" || _bad=1; done
    PIDS=""
    _t1=$(date +%s.%N)
    echo "$_t0 $_t1" > "$OUT/$_name.time"
    [ $_bad -eq 0 ] || { echo "elastic_cost.sh: run $_name failed" \
                              "(logs in $OUT)" >&2; exit 1; }
}

echo "elastic_cost.sh: $NP peers, ResNet-18 width $WIDTH at $SIZE x $SIZE," \
    "batch $BATCH, $ITERS steps, $PAIRS pairs; load: $(cut -d' ' -f1-3 \
    /proc/loadavg) on $(nproc) cores"
i=1
while [ $i -le "$PAIRS" ]; do
    if [ $((i % 2)) -eq 1 ]; then
        one plain$i
        one elastic$i --elastic
    else
        one elastic$i --elastic
        one plain$i
    fi
    echo "elastic_cost.sh: pair $i done"
    i=$((i + 1))
done
echo "elastic_cost.sh: load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" "$PAIRS" "$ITERS" "$NP" <<'EOF' | tee "$OUT/summary.txt"
import glob, json, re, statistics as st, sys
out, pairs, iters, np_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4])

def run(name):
    t0, t1 = map(float, open("%s/%s.time" % (out, name)).read().split())
    recs = [json.loads(l) for l in open("%s/%s.metrics" % (out, name))]
    steps = [r for r in recs if "loss" in r][5:]  # after the warm-up
    snap = sum(r.get("t_snapshot", 0) for r in steps)
    tstep = sum(r["t_step"] for r in steps)
    cpu = []
    for f in glob.glob("%s/%s.p*.log" % (out, name)):
        for l in open(f):
            m = re.search(r"view thread used ([0-9.]+) s of CPU in "
                          r"([0-9.]+) s", l)
            if m:
                cpu.append((float(m.group(1)), float(m.group(2))))
    # the optimizer's time per step (rank 0's timeline, after the warm-up)
    tl = json.load(open("%s/%s.tl.json" % (out, name)))["traceEvents"]
    opt = [e["dur"] * 1e-6 for e in tl if e.get("name") == "optimizer" and
           e.get("args", {}).get("step", 0) >= 5]
    return (t1 - t0) / iters, tstep / len(steps), snap / tstep, cpu, \
        st.mean(opt) if opt else 0.0

def ms(v):
    return "%.2f ms +- %.2f" % (1e3 * st.mean(v), 1e3 * st.stdev(v)) \
        if len(v) > 1 else "%.2f ms" % (1e3 * v[0])

rows = {m: [run("%s%d" % (m, i)) for i in range(1, pairs + 1)]
        for m in ("plain", "elastic")}
with open(out + "/runs.csv", "w") as f:
    f.write("mode,pair,wall_per_step_s,mean_t_step_s,snapshot_share\n")
    for m, rs in rows.items():
        for i, r in enumerate(rs):
            f.write("%s,%d,%.6f,%.6f,%.6f\n" % (m, i + 1, r[0], r[1], r[2]))
for m in ("plain", "elastic"):
    rs = rows[m]
    print("%-8s wall per step %s, metrics t_step %s (%d runs)"
          % (m, ms([r[0] for r in rs]), ms([r[1] for r in rs]), len(rs)))
pw = [r[0] for r in rows["plain"]]
ew = [r[0] for r in rows["elastic"]]
pt = [r[1] for r in rows["plain"]]
et = [r[1] for r in rows["elastic"]]
diff = [e / p - 1 for e, p in zip(ew, pw)]
print("elastic vs plain, wall per step: %+.2f %% (pairs: %s)"
      % (100 * (st.mean(ew) / st.mean(pw) - 1),
         ", ".join("%+.1f" % (100 * d) for d in diff)))
print("elastic vs plain, metrics t_step: %+.2f %%"
      % (100 * (st.mean(et) / st.mean(pt) - 1)))
shares = [r[2] for r in rows["elastic"]]
print("copy at the step's start (t_snapshot / t_step, rank 0): mean %.3f %%, "
      "max %.3f %%" % (100 * st.mean(shares), 100 * max(shares)))
po = [r[4] for r in rows["plain"]]
eo = [r[4] for r in rows["elastic"]]
print("optimizer per step (rank 0's timeline): plain %s, elastic %s "
      "(the update that keeps the state)" % (ms(po), ms(eo)))
# the update's extra time, per pair, against that pair's elastic step
extra = [(e[4] - p[4]) / e[1] for e, p in zip(rows["elastic"], rows["plain"])]
total = [s + x for s, x in zip(shares, extra)]
print("update's extra share of the step: mean %+.3f %% (pairs: %s)"
      % (100 * st.mean(extra), ", ".join("%+.3f" % (100 * x) for x in extra)))
print("snapshot cost in all (start copy + update's extra): mean %.3f %%, "
      "max %.3f %% of the step time" % (100 * st.mean(total),
                                         100 * max(total)))
cpu = [c for r in rows["elastic"] for c in r[3]]
if cpu:
    share = [c / w for c, w in cpu]
    print("view thread CPU: mean %.2f ms over %.1f s per peer (%.4f %% of "
          "one core; max %.4f %%)"
          % (1e3 * st.mean(c for c, _ in cpu), st.mean(w for _, w in cpu),
             100 * st.mean(share), 100 * max(share)))
EOF
