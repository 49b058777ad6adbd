#!/bin/sh
# bench/view_change.sh: where an --elastic view change's time goes, per
# kind of change (run by hand; --hosts netns needs root).
#
#   bench/view_change.sh [--hosts loopback|netns] [--cycles N] [--out DIR]
#
# 8 slots train a tiny ResNet-18 (width 4, 14 x 14, batch 8 per peer,
# --peer-timeout 1), on one host (loopback: shm between the peers) or on
# 8 namespace hosts with 1 Gbit/s links (scripts/netns.sh). Slots 0-6
# start and form a view of 7 after --join-timeout; then each cycle (N,
# default 2) makes six view changes, each once the last has settled:
# slot 7 joins, slot 6 is killed (SIGKILL), slot 6 rejoins, slot 5 is
# stopped (SIGSTOP: it is left out after the peer timeout), slot 5 is
# killed and rejoins, slot 7 is killed. Each peer logs at debug level
# (MESHTRAIN_LOG=debug: the tcp line counts the failed and refused
# dials; the collectives' lines slow the steps, not the view changes).
# Reports per kind (kill, stop, join): the median and worst view change
# (rank 0's recovery_s, from the failure it saw to the view ready: a
# stop's detection, --peer-timeout, comes before it) and the median of
# each of its parts (agree, restore, mesh, xfer, ready); over every
# peer, the median and worst time its mesh took to open ("joined the
# mesh ... in T s") and the dials that failed, and were refused, first.
# Writes DIR/summary.txt and the logs (default DIR=bench-vc-out). Take
# the bench lock (/tmp/bench.d) around timed runs on shared machines.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
MESHTRAIN=${MESHTRAIN:-$top/meshtrain}
NETNS=$top/scripts/netns.sh
HOSTS=loopback
CYCLES=2
OUT=bench-vc-out
while [ $# -gt 0 ]; do
    case $1 in
    --hosts) HOSTS=$2 ;;
    --cycles) CYCLES=$2 ;;
    --out) OUT=$2 ;;
    *) echo "usage: bench/view_change.sh [--hosts loopback|netns]" \
            "[--cycles N] [--out DIR]" >&2
       exit 2 ;;
    esac
    shift 2
done
case $HOSTS in loopback | netns) ;; *)
    echo "view_change.sh: --hosts loopback or netns, not '$HOSTS'" >&2
    exit 2 ;;
esac
case $CYCLES in '' | *[!0-9]* | 0)
    echo "view_change.sh: --cycles takes a count >= 1" >&2; exit 2 ;;
esac
[ -x "$MESHTRAIN" ] || { echo "view_change.sh: build meshtrain first" >&2
    exit 1; }
command -v python3 > /dev/null || { echo "view_change.sh: needs python3" >&2
    exit 1; }
PREFIX=vc$(( $$ % 1000 ))
rm -rf "$OUT"
mkdir -p "$OUT"
PIDS=""
cleanup() {
    for p in $PIDS; do kill -KILL "$p" 2> /dev/null; done
    [ "$HOSTS" = netns ] && sh "$NETNS" down --prefix "$PREFIX" > /dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM
head -c 32 /dev/urandom | base64 > "$OUT/secret"
chmod 600 "$OUT/secret"
if [ "$HOSTS" = netns ]; then
    why=$(sh "$NETNS" check --prefix "$PREFIX" 2>&1) ||
        { echo "view_change.sh: network namespaces unavailable: $why" >&2
          exit 1; }
    sh "$NETNS" up 8 --prefix "$PREFIX" --rate 1gbit > /dev/null ||
        { echo "view_change.sh: scripts/netns.sh up failed" >&2; exit 1; }
    : > "$OUT/hosts"
    for i in 1 2 3 4 5 6 7 8; do
        echo "10.77.0.$i slots=1" >> "$OUT/hosts"
    done
    HF="--hostfile $OUT/hosts"
else
    HF="-H localhost:8"
fi
export OMP_WAIT_POLICY=passive MESHTRAIN_LOG=debug

# peer R: start slot R (its pid in $P<R>).
peer() {
    _pre=""
    [ "$HOSTS" = netns ] && _pre="ip netns exec $PREFIX$(($1 + 1))"
    # shellcheck disable=SC2086
    $_pre "$MESHTRAIN" $HF --rank "$1" --port 29750 \
        --secret-file "$OUT/secret" --model resnet18 --width 4 --cifar-stem \
        --image-size 14 --in-channels 1 --num-classes 10 \
        --data synthetic:4000 --batch 8 --threads 1 --data-threads 1 \
        --iters 1000000 --no-eval --verify-every 0 --elastic \
        --join-timeout 5 --peer-timeout 1 --metrics "$OUT/metrics" \
        >> "$OUT/p$1.log" 2>&1 &
    eval "P$1=$!"
    PIDS="$PIDS $!"
}
nviews() {
    _n=$(grep -c '"event": "view"' "$OUT/metrics" 2> /dev/null)
    echo "${_n:-0}"
}
# settled V: wait (at most 120 s) for view V's record, then 2 s; each
# log gets a mark, so that the lines after it are the next change's.
settled() {
    _i=0
    while [ "$(nviews)" -lt "$1" ] && [ $_i -lt 600 ]; do
        sleep 0.2
        _i=$((_i + 1))
    done
    [ "$(nviews)" -ge "$1" ] ||
        { echo "view_change.sh: view $1 never came" >&2; exit 1; }
    sleep 2
    for f in "$OUT"/p*.log; do echo "=== after view $1" >> "$f"; done
}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in 0 1 2 3 4 5 6; do peer $r; done
settled 1
V=1
c=0
while [ $c -lt "$CYCLES" ]; do
    peer 7; V=$((V + 1)); settled $V; echo "join $V" >> "$OUT/events"
    kill -KILL "$P6"; V=$((V + 1)); settled $V; echo "kill $V" >> "$OUT/events"
    peer 6; V=$((V + 1)); settled $V; echo "join $V" >> "$OUT/events"
    kill -STOP "$P5"; V=$((V + 1)); settled $V; echo "stop $V" >> "$OUT/events"
    kill -KILL "$P5"; sleep 1
    peer 5; V=$((V + 1)); settled $V; echo "join $V" >> "$OUT/events"
    kill -KILL "$P7"; V=$((V + 1)); settled $V; echo "kill $V" >> "$OUT/events"
    c=$((c + 1))
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
{
    echo "bench/view_change.sh: $HOSTS, 8 slots, $CYCLES cycle(s);" \
        "load $load0 at the start, $load1 at the end"
    python3 - "$OUT" << 'PY'
import collections, glob, json, re, sys
out = sys.argv[1]
views = [json.loads(l) for l in open(out + "/metrics")
         if '"event": "view"' in l]
kind = dict((int(v), k) for k, v in
            (l.split() for l in open(out + "/events")))
# each peer's mesh in view V's change: its lines between the marks
per = collections.defaultdict(list)
for f in glob.glob(out + "/p*.log"):
    v, cur = 0, {}
    for l in open(f, errors="replace"):
        m = re.match(r"=== after view (\d+)", l)
        if m:
            v = int(m.group(1))
            continue
        m = re.search(r"(\d+) dial\(s\) failed first \((\d+) refused", l)
        if m:
            cur = {"failed": int(m.group(1)), "refused": int(m.group(2))}
        m = re.search(r"joined the mesh: .* in ([0-9.]+) s", l)
        if m:
            cur["open"] = float(m.group(1))
            per[v + 1].append(cur)
            cur = {}
med = lambda x: sorted(x)[len(x) // 2]
for k in ("kill", "stop", "join"):
    vs = [v for v in views if kind.get(v["view"]) == k]
    if not vs:
        continue
    rs = [v["recovery_s"] for v in vs]
    print("%-4s n=%d: view change median %.3f s, worst %.3f s; parts "
          "(median s): %s" % (k, len(vs), med(rs), max(rs), ", ".join(
              "%s %.3f" % (p, med([v["parts"][p] for v in vs]))
              for p in ("agree", "restore", "mesh", "xfer", "ready"))))
    ps = [p for v in vs for p in per.get(v["view"], []) if "open" in p]
    if ps:
        print("     each peer's mesh: median %.3f s, worst %.3f s; dials "
              "failed first %d, refused %d (on %d of %d peer meshes)" % (
                  med([p["open"] for p in ps]), max(p["open"] for p in ps),
                  sum(p.get("failed", 0) for p in ps),
                  sum(p.get("refused", 0) for p in ps),
                  sum(1 for p in ps if p.get("refused", 0)), len(ps)))
PY
} | tee "$OUT/summary.txt"
