#!/bin/sh
# bench/join.sh: how long a peer takes to join a running --elastic job,
# against the state size over the link rate (run by hand, as root).
#
#   bench/join.sh [--senders "1 3 7"] [--runs N] [--rate R] [--model M]
#                 [--width W] [--image-size S] [--catchup yes|no] [--out DIR]
#
# 8 hosts in network namespaces (scripts/netns.sh), each host's egress
# shaped by tbf to --rate (default 1gbit). For each K of --senders: slots
# 0-6 train (--elastic; they form their view of 7 after --join-timeout),
# then slot 7 starts and joins; MESHTRAIN_XFER_SENDERS=K makes only the K
# lowest slots send it the state (train/xfer.c), so that one setup shows
# the striping. --runs N (default 1) repeats each K's join N times, each
# in a fresh job (the join's moment against the members' step boundaries
# varies: a joiner is admitted only at one). With --catchup no (MESHTRAIN_NO_CATCHUP) the joiner gets
# the whole state in the view change that admits it, instead of fetching
# a snapshot and replaying steps while the members train
# (train/catchup.c). The model is --model (default resnet50: about 205 MB of
# weights and momentum, plus BN statistics) at a small --image-size
# (default 32) with batch 1, so that steps stay short on a small machine.
#
# Reported per K, from the joiner's lines ("slot 7 joined view V: step S
# done J s after start; state N bytes received in T s (slot 0: B, ...)"
# and "slot 7's join, s after start: main .., input .., answered ..,
# built .., model .., bytes in .., snapshot .., admitted .., mesh ..,
# state .., first step B, done J"; with the catch-up, when each stripe's
# first and last bytes came, "its stripes came ..."):
#   join time J (from the start of the process to its first step done)
#   and B (to its first step begun: it holds the state and is a member),
#   transfer time T and the bytes from each sender,
#   the bounds N / R (one link) and N / (K x R) (K senders' shaped
#   uplinks; the joiner's own ingress is not shaped), J and B over N / R
#   (the issue's goal: <= 1.2 for ResNet-50), the wait from the JOIN's
#   answer to the decision that admits it (the members' next step
#   boundary and their agreement), and every stage's moment; with --runs,
#   per K the median and worst of J / (N/R) and B / (N/R) over the runs.
# Writes DIR/summary.txt and the logs (default DIR=bench-join-out).
# Take the bench lock (/tmp/bench.d) around timed runs on shared machines.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
MESHTRAIN=${MESHTRAIN:-$top/meshtrain}
NETNS=$top/scripts/netns.sh
SENDERS="1 3 7"
RATE=1gbit
MODEL=resnet50
WIDTH=64
SIZE=32
OUT=bench-join-out
CATCHUP=yes
RUNS=1
while [ $# -gt 0 ]; do
    case $1 in
    --senders) SENDERS=$2 ;;
    --runs) RUNS=$2 ;;
    --rate) RATE=$2 ;;
    --model) MODEL=$2 ;;
    --width) WIDTH=$2 ;;
    --image-size) SIZE=$2 ;;
    --out) OUT=$2 ;;
    --catchup) CATCHUP=$2 ;;
    *) echo "usage: bench/join.sh [--senders \"1 3 7\"] [--runs N]" \
            "[--rate R] [--model M] [--width W] [--image-size S] [--catchup yes|no]" \
            "[--out DIR]" >&2
       exit 2 ;;
    esac
    shift 2
done
case $RUNS in
'' | *[!0-9]* | 0) echo "join.sh: --runs takes a count >= 1, not '$RUNS'" >&2
    exit 2 ;;
esac
[ -x "$MESHTRAIN" ] || { echo "join.sh: build meshtrain first" >&2; exit 1; }
case $RATE in
*gbit) BPS=$(( ${RATE%gbit} * 1000000000 )) ;;
*mbit) BPS=$(( ${RATE%mbit} * 1000000 )) ;;
*) echo "join.sh: --rate as Ngbit or Nmbit" >&2; exit 2 ;;
esac
PREFIX=jn$(( $$ % 1000 ))
why=$(sh "$NETNS" check --prefix "$PREFIX" 2>&1) ||
    { echo "join.sh: network namespaces unavailable: $why" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PIDS=""
cleanup() {
    for p in $PIDS; do kill -KILL "$p" 2> /dev/null; done
    sh "$NETNS" down --prefix "$PREFIX" > /dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM
SLOTS=8
sh "$NETNS" up "$SLOTS" --prefix "$PREFIX" --rate "$RATE" > /dev/null ||
    { echo "join.sh: scripts/netns.sh up failed" >&2; exit 1; }
: > "$OUT/hosts"
i=1
while [ $i -le $SLOTS ]; do
    echo "10.77.0.$i slots=1" >> "$OUT/hosts"
    i=$((i + 1))
done
head -c 32 /dev/urandom | base64 > "$OUT/secret"
chmod 600 "$OUT/secret"
export OMP_WAIT_POLICY=passive
[ "$CATCHUP" = no ] && export MESHTRAIN_NO_CATCHUP=1

# peer R LOG: start slot R in its host.
peer() {
    ip netns exec "$PREFIX$(($1 + 1))" "$MESHTRAIN" \
        --hostfile "$OUT/hosts" --rank "$1" --port 29700 \
        --secret-file "$OUT/secret" --model "$MODEL" --width "$WIDTH" \
        --image-size "$SIZE" --threads 1 --data-threads 1 \
        --data synthetic:2000 --batch 1 --iters 100000 --no-eval \
        --verify-every 0 --elastic --join-timeout 20 --peer-timeout 30 \
        --log-every 1 --metrics "$OUT/$T.metrics" > "$2" 2>&1 &
    PIDS="$PIDS $!"
}

# wait_log LOG PATTERN: until LOG holds PATTERN (grep), at most 6 minutes.
wait_log() {
    _i=0
    until grep -q "$2" "$1" 2> /dev/null || [ $_i -ge 1800 ]; do
        sleep 0.2
        _i=$((_i + 1))
    done
}

{
    echo "bench/join.sh: $SLOTS hosts, egress $RATE each, $MODEL width" \
        "$WIDTH at ${SIZE}x$SIZE; slot 7 joins 7 training peers;" \
        "catch-up $CATCHUP"
    echo "load: $(uptime)"
    printf '%-8s %12s %8s %8s %8s %8s %8s %8s %8s  %s\n' senders state_B \
        join_s begun_s xfer_s "N/R_s" "N/(KR)_s" "J/(N/R)" "B/(N/R)" \
        "bytes per sender"
} | tee "$OUT/summary.txt"
rm -f "$OUT/ratios"
for K in $SENDERS; do
    run=1
    while [ $run -le "$RUNS" ]; do
        PIDS=""
        T=k$K.r$run
        rm -f "$OUT/$T.metrics"
        export MESHTRAIN_XFER_SENDERS=$K
        echo "K=$K run $run: load at the start $(cut -d' ' -f1-3 /proc/loadavg)" |
            tee -a "$OUT/summary.txt"
        r=0
        while [ $r -lt 7 ]; do
            peer $r "$OUT/$T.p$r.log"
            r=$((r + 1))
        done
        # the 7 train (their view formed after the join timeout) before the
        # joiner starts
        wait_log "$OUT/$T.p0.log" "step 3/\|step 3 "
        peer 7 "$OUT/$T.p7.log"
        wait_log "$OUT/$T.p7.log" "slot 7 joined view"
        # two more step records, so that rank 0's metrics hold the steps
        # around the admission (bench/join_pause.py)
        n=$(grep -c '"loss"' "$OUT/$T.metrics" 2> /dev/null)
        i=0
        until [ "$(grep -c '"loss"' "$OUT/$T.metrics" 2> /dev/null)" -ge \
            $((${n:-0} + 2)) ] || [ $i -ge 300 ]; do
            sleep 0.2
            i=$((i + 1))
        done
        unset MESHTRAIN_XFER_SENDERS
        for p in $PIDS; do kill -KILL "$p" 2> /dev/null; done
        wait 2> /dev/null
        echo "K=$K run $run: load at the end $(cut -d' ' -f1-3 /proc/loadavg)" |
            tee -a "$OUT/summary.txt"
        line=$(grep "slot 7 joined view" "$OUT/$T.p7.log")
        if [ -z "$line" ]; then
            echo "join.sh: K=$K: the joiner did not join (see $OUT/k$K.p7.log)" |
                tee -a "$OUT/summary.txt"
            continue
        fi
        marks=$(sed -n "s/.*slot 7's join, s after start: //p" "$OUT/$T.p7.log")
        # the whole state (a joiner that caught up receives only part of it
        # in the view change: train/catchup.c)
        state=$(sed -n 's/.*"state_bytes": \([0-9]*\),.*/\1/p' \
            "$OUT/$T.metrics" | tail -n 1)
        echo "$line" | awk -v k="$K" -v bps="$BPS" -v marks="$marks" \
            -v state="${state:-0}" -v ratios="$OUT/ratios" '{
            for (i = 1; i <= NF; i++) {
                if ($i == "after") j = $(i - 2)
                if ($i == "state") n = $(i + 1)
                if ($i == "in" && $(i + 2) == "s") x = $(i + 1)
            }
            if (state > 0) n = state
            per = $0; sub(/.*s \(/, "", per); sub(/\)$/, "", per)
            m = split(marks, f, /, /)
            for (i = 1; i <= m; i++) {
                v = f[i]; sub(/.* /, "", v); name = f[i]; sub(/ [^ ]*$/, "", name)
                t[name] = v
            }
            b = t["first step"]
            b1 = n * 8 / bps
            printf "%-8d %12d %8.3f %8.3f %8.3f %8.3f %8.3f %8.2f %8.2f  %s\n",
                k, n, j, b, x, b1, b1 / k, j / b1, b / b1, per
            printf "%d %.3f %.3f\n", k, j / b1, b / b1 >> ratios
            printf "         stages (s after start): %s\n", marks
            if ("snapshot" in t)
                printf "         catch-up: answered to snapshot loaded %.3f s;" \
                    " snapshot to admitted %.3f s\n",
                    t["snapshot"] - t["answered"], t["admitted"] - t["snapshot"]
            printf "         answered to admitted: %.3f s; admitted to first" \
                " step begun: %.3f s; first step: %.3f s\n",
                t["admitted"] - t["answered"], b - t["admitted"], j - b
        }' | tee -a "$OUT/summary.txt"
        # when each stripe's first and last bytes came (the catch-up's)
        sed -n 's/.*its stripes came ([^)]*): /         stripes (s into the'\
' catch-up, first-last byte): /p' "$OUT/$T.p7.log" | tail -n 1 |
            tee -a "$OUT/summary.txt"
        # the members' pause (bench/join_pause.py): a step, a step while the
        # joiner caught up, the interval across the admission, that less a
        # step, the view change, bytes sent in it and the whole state, the
        # joiner's snapshot step (catch-up), the admission step, join time
        printf '         pause: %s\n' "$(python3 "$top/bench/join_pause.py" \
            "$OUT/$T.metrics" "$OUT/$T.p7.log" "K=$K")" |
            tee -a "$OUT/summary.txt"
        run=$((run + 1))
    done
done
# with --runs: per K, the median and worst of J / (N/R) and B / (N/R)
if [ "$RUNS" -gt 1 ]; then
    echo "over $RUNS runs per K (J: to the first step done, B: begun;" \
        "a run whose joiner did not join counts as worst):" |
        tee -a "$OUT/summary.txt"
    for K in $SENDERS; do
        awk -v k="$K" '$1 == k { n++; j[n] = $2; b[n] = $3 }
        function med_worst(a, n,    i, m, t, s, w) {
            m = 0
            for (i = 1; i <= n; i++)
                if (a[i] == "-") w = "-"; else s[++m] = a[i] + 0
            for (i = 2; i <= m; i++)
                for (t = i; t > 1 && s[t - 1] > s[t]; t--) {
                    x = s[t]; s[t] = s[t - 1]; s[t - 1] = x
                }
            if (m == 0) return "- -"
            med = m % 2 ? s[(m + 1) / 2] : (s[m / 2] + s[m / 2 + 1]) / 2
            return sprintf("%.2f %s", med, w == "-" ? "-" : sprintf("%.2f", s[m]))
        }
        END {
            split(med_worst(j, n), a, " "); split(med_worst(b, n), c, " ")
            printf "K=%-6d runs %d  J/(N/R) median %s worst %s;" \
                "  B/(N/R) median %s worst %s\n", k, n, a[1], a[2], c[1], c[2]
        }' "$OUT/ratios" | tee -a "$OUT/summary.txt"
    done
fi
