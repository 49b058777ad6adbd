#!/bin/sh
# bench/chaos.sh: the elastic mesh under chaos (run by hand, as root).
#
#   bench/chaos.sh [--slots N] [--min-peers M] [--iters I] [--seed S]
#                  [--peer-timeout T] [--width W] [--image-size S]
#                  [--batch B] [--out DIR]
#
# N hosts (default 8) in network namespaces (scripts/netns.sh), one
# meshtrain peer each, train a ResNet-18 (--width, default 4, CIFAR stem)
# on Fashion-MNIST at --image-size (default 14) with --batch (default 8)
# per peer for --iters steps (default 400) twice:
#   1. fault-free (--elastic, nothing injected), and
#   2. under chaos: a driver waits a random 2 to 20 s, then kills a random
#      live peer with SIGKILL, stops one with SIGSTOP, or drops its link
#      (its veth down), never leaving fewer than --min-peers (default 3).
# Both use --keep-global-batch, so the two runs see the same samples per
# step. It reports steps per minute of each, the recovery time of each
# fault (from the fault to the view change that excludes the peer, when
# training resumes, and to the next step completed after it; the
# distribution and the worst), and the final top-1 accuracy of each,
# and writes DIR/faults.csv, DIR/summary.txt and the logs (default
# DIR=bench-chaos-out). Goals (issue 25): recovery <= 1 s after a crash,
# <= --peer-timeout + 1 s after silence (SIGSTOP, link); no hang and no
# digest mismatch; accuracy within 0.5 points of the fault-free run.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
MESHTRAIN=${MESHTRAIN:-$top/meshtrain}
NETNS=$top/scripts/netns.sh
SLOTS=8
MINP=3
ITERS=400
SEED=1
PT=2
WIDTH=4
SIZE=14
BATCH=8
OUT=bench-chaos-out
while [ $# -gt 0 ]; do
    case $1 in
    --slots) SLOTS=$2 ;;
    --min-peers) MINP=$2 ;;
    --iters) ITERS=$2 ;;
    --seed) SEED=$2 ;;
    --peer-timeout) PT=$2 ;;
    --width) WIDTH=$2 ;;
    --image-size) SIZE=$2 ;;
    --batch) BATCH=$2 ;;
    --out) OUT=$2 ;;
    *) echo "usage: bench/chaos.sh [--slots N] [--min-peers M] [--iters I]" \
            "[--seed S] [--peer-timeout T] [--width W] [--batch B]" \
            "[--out DIR]" >&2
       exit 2 ;;
    esac
    shift 2
done
[ -x "$MESHTRAIN" ] || { echo "chaos.sh: build meshtrain first" >&2; exit 1; }
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "chaos.sh: no Fashion-MNIST in $DATA" >&2; exit 1; }
PREFIX=ch$(( $$ % 1000 ))
why=$(sh "$NETNS" check --prefix "$PREFIX" 2>&1) ||
    { echo "chaos.sh: network namespaces unavailable: $why" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PIDS=""
cleanup() {
    for p in $PIDS; do kill -CONT "$p" 2> /dev/null; kill -KILL "$p" \
        2> /dev/null; done
    sh "$NETNS" down --prefix "$PREFIX" > /dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM
sh "$NETNS" up "$SLOTS" --prefix "$PREFIX" > /dev/null ||
    { echo "chaos.sh: scripts/netns.sh up failed" >&2; exit 1; }
: > "$OUT/hosts"
i=1
while [ $i -le "$SLOTS" ]; do
    echo "10.77.0.$i slots=1" >> "$OUT/hosts"
    i=$((i + 1))
done
head -c 32 /dev/urandom | base64 > "$OUT/secret"
chmod 600 "$OUT/secret"
export OMP_WAIT_POLICY=passive MESHTRAIN_LOG=info

# job NAME: start the peers; their pids in $PIDS.
job() {
    PIDS=""
    r=0
    while [ $r -lt "$SLOTS" ]; do
        ip netns exec "$PREFIX$((r + 1))" "$MESHTRAIN" \
            --hostfile "$OUT/hosts" --rank $r --port 29600 \
            --secret-file "$OUT/secret" --model resnet18 --width "$WIDTH" \
            --cifar-stem --image-size "$SIZE" --threads 1 --data-threads 1 --data "fashion-mnist" \
            --batch "$BATCH" --lr 0.1 --iters "$ITERS" --eval-every 0 \
            --verify-every 20 --elastic --keep-global-batch \
            --min-peers "$MINP" --peer-timeout "$PT" --join-timeout 120 \
            --log-every 50 --metrics "$OUT/$1.metrics" \
            > "$OUT/$1.p$r.log" 2>&1 &
        PIDS="$PIDS $!"
        r=$((r + 1))
    done
}

# running: a peer not yet hit by a fault still runs (then the job does)
running() {
    for v in ${alive:-}; do kill -0 "${v#*:}" 2> /dev/null && return 0; done
    return 1
}

# an integer in [LO, HI], the next of the --seed stream
awk -v s="$SEED" 'BEGIN { srand(s); for (i = 0; i < 10000; i++) print rand() }' \
    > "$OUT/random"
NRAND=0
rand() { # rand VAR LO HI: VAR gets it (no subshell: the stream advances)
    NRAND=$((NRAND + 1))
    _v=$(sed -n "${NRAND}p" "$OUT/random" |
        awk -v lo="$2" -v hi="$3" '{ print int(lo + $1 * (hi - lo + 1)) }')
    eval "$1=\$_v"
}

echo "chaos.sh: $SLOTS hosts, ResNet-18 width $WIDTH, batch $BATCH per peer," \
    "$ITERS steps, --min-peers $MINP, --peer-timeout $PT"
echo "chaos.sh: 1. fault-free run"
t0=$(date +%s.%N)
job free
for p in $PIDS; do wait "$p"; done
alive=""
t1=$(date +%s.%N)
echo "$t0 $t1" > "$OUT/free.time"

echo "chaos.sh: 2. chaos run"
: > "$OUT/faults.csv"
t0=$(date +%s.%N)
job chaos
set -- $PIDS
alive=""
r=0
for p in "$@"; do alive="$alive $r:$p"; r=$((r + 1)); done
nalive=$SLOTS
while running; do
    rand wait_s 2 20
    i=0
    while [ $i -lt $((wait_s * 10)) ] && running; do
        sleep 0.1
        i=$((i + 1))
    done
    running || break
    [ "$nalive" -le "$MINP" ] && continue
    rand k 1 "$nalive"
    victim=$(echo $alive | tr ' ' '\n' | sed -n "${k}p")
    slot=${victim%%:*}
    pid=${victim#*:}
    rand kind_n 1 3
    case $kind_n in
    1) kind=kill; now=$(date +%s.%N); kill -KILL "$pid" ;;
    2) kind=stop; now=$(date +%s.%N); kill -STOP "$pid" ;;
    *) kind=link; now=$(date +%s.%N)
       ip link set "${PREFIX}v$((slot + 1))" down ;;
    esac
    echo "$now,$kind,$slot" >> "$OUT/faults.csv"
    echo "chaos.sh: $kind slot $slot"
    alive=$(echo $alive | tr ' ' '\n' | grep -v "^$slot:" | tr '\n' ' ')
    nalive=$((nalive - 1))
done
t1=$(date +%s.%N)
echo "$t0 $t1" > "$OUT/chaos.time"
# the peers hit by a fault: continued (they find themselves left out)
for p in $PIDS; do kill -CONT "$p" 2> /dev/null; done
for p in $PIDS; do wait "$p"; done

python3 - "$OUT" "$ITERS" "$PT" <<'EOF' | tee "$OUT/summary.txt"
import glob, json, re, sys
out, iters, pt = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def run(name):
    t0, t1 = map(float, open("%s/%s.time" % (out, name)).read().split())
    recs = [json.loads(l) for l in open("%s/%s.metrics" % (out, name))]
    steps = [r for r in recs if "loss" in r]
    views = [r for r in recs if r.get("event") == "view"]
    acc = None
    for f in glob.glob("%s/%s.p*.log" % (out, name)):
        for l in open(f):
            m = re.search(r"test accuracy after \d+ steps: top-1 ([0-9.]+)", l)
            if m:
                acc = float(m.group(1))
    mism = sum("weights differ" in open(f).read()
               for f in glob.glob("%s/%s.p*.log" % (out, name)))
    return t0, t1, steps, views, acc, mism

f0, f1, fsteps, _, facc, fmis = run("free")
c0, c1, csteps, cviews, cacc, cmis = run("chaos")
fspm = len(fsteps) / ((f1 - f0) / 60)
cspm = len(csteps) / ((c1 - c0) / 60)
print("fault-free: %d steps in %.1f s: %.1f steps/min, top-1 %s %%"
      % (len(fsteps), f1 - f0, fspm, facc))
print("chaos:      %d steps in %.1f s: %.1f steps/min (%.1f %% of "
      "fault-free), top-1 %s %%, %d view change(s)"
      % (len(csteps), c1 - c0, cspm, 100 * cspm / fspm, cacc, len(cviews)))
faults = [l.strip().split(",") for l in open(out + "/faults.csv") if l.strip()]
print("faults: %d (%s)" % (len(faults), ", ".join(k + " " + s for _, k, s in
                                                 faults)))
rec = {}
for t, kind, slot in faults:
    t = float(t)
    # the first view change after the fault, then the first step after it
    vs = [v for v in cviews if v["wall"] >= t]
    if not vs:
        print("  %s slot %s: no view change after it" % (kind, slot))
        continue
    nxt = [s["wall"] for s in csteps if s["wall"] > vs[0]["wall"]]
    if not nxt:
        print("  %s slot %s: no step after the view change" % (kind, slot))
        continue
    r = min(nxt) - t
    rv = vs[0]["wall"] - t
    rec.setdefault(kind, []).append((rv, r))
    print("  %s slot %s: training resumed after %.3f s, next step done "
          "after %.3f s (view %d, %d peers)"
          % (kind, slot, rv, r, vs[0]["view"], vs[0]["peers"]))
steps_s = sorted(s["t_step"] for s in fsteps)
print("step time (fault-free): median %.3f s" % steps_s[len(steps_s) // 2])
for kind, rs in sorted(rec.items()):
    goal = 1.0 if kind == "kill" else pt + 1.0
    for i, what in ((0, "to resume"), (1, "to the next step")):
        v = sorted(x[i] for x in rs)
        print("recovery %-4s %-16s: n=%d median %.3f s, worst %.3f s "
              "(goal <= %.1f s)" % (kind, what, len(v), v[len(v) // 2],
                                   v[-1], goal))
print("digest mismatches: %d (fault-free %d)" % (cmis, fmis))
if facc is not None and cacc is not None:
    print("accuracy: %.2f %% vs %.2f %% fault-free (%+.2f points)"
          % (cacc, facc, cacc - facc))
EOF
