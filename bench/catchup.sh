#!/bin/sh
# bench/catchup.sh: the pause a joiner's admission adds to the members'
# training, with the catch-up (train/catchup.c) and without it
# (MESHTRAIN_NO_CATCHUP=1: the whole state in the view change). Run by
# hand; take the bench lock (/tmp/bench.d) on a shared machine.
#
#   bench/catchup.sh [--peers P] [--runs R] [--iters I] [--at S]
#                    [--model M] [--width W] [--image-size S] [--out DIR]
#                    [--base BINARY] [--start I]
#
# P peers (default 3) train on this host (--elastic, a job of P + 1
# slots: their view forms after a 3 s join timeout); at step --at (20)
# slot P starts and joins. bench/join_pause.py reports, from rank 0's
# metrics, a normal step, the interval across the view change that
# admits the joiner and the pause (that less a normal step), the view
# change's own time, the bytes sent in it and the whole state; from the
# joiner, its snapshot's step and its join time. Each mode runs R times
# (default 3), alternating (catch-up, whole, catch-up, whole, ...: load
# that changes hits both alike). bench/catchup_summary.py then gives, per
# mode, the median and range of the pause and of the view change, and
# where the view change went on rank 0 and on the joiner (its stage line:
# agreement, mesh, transfer, SHA-256, weight check), with each run's
# load averages at its start and end. Writes DIR/summary.txt and the
# logs (default DIR=bench-catchup-out). --base BINARY runs another
# meshtrain (an older build) in both modes too, in the same alternation
# (runs bc1, bw1, ...). --start I numbers the runs from I and adds to
# DIR's summary: rounds in separate invocations (each under its own hold
# of the bench lock) make one summary.
#
# ResNet-50 (a 190 MB state with 10 classes; about 1 s a step here):
#   bench/catchup.sh --model resnet50 --width 64 --iters 40 --at 8
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
MESHTRAIN=${MESHTRAIN:-$top/meshtrain}
PEERS=3
RUNS=3
ITERS=400
AT=20
MODEL=resnet18
WIDTH=4
SIZE=12
OUT=bench-catchup-out
BASE=
START=1
while [ $# -gt 0 ]; do
    case $1 in
    --peers) PEERS=$2 ;;
    --runs) RUNS=$2 ;;
    --iters) ITERS=$2 ;;
    --at) AT=$2 ;;
    --model) MODEL=$2 ;;
    --width) WIDTH=$2 ;;
    --image-size) SIZE=$2 ;;
    --out) OUT=$2 ;;
    --base) BASE=$2 ;;
    --start) START=$2 ;;
    *) echo "usage: bench/catchup.sh [--peers P] [--runs R] [--iters I]" \
            "[--at S] [--model M] [--width W] [--image-size S]" \
            "[--out DIR] [--base BINARY] [--start I]" >&2
       exit 2 ;;
    esac
    shift 2
done
[ -x "$MESHTRAIN" ] || { echo "catchup.sh: build meshtrain first" >&2; exit 1; }
[ -z "$BASE" ] || [ -x "$BASE" ] ||
    { echo "catchup.sh: --base $BASE is not an executable" >&2; exit 1; }
command -v python3 > /dev/null ||
    { echo "catchup.sh: needs python3" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SLOTS=$((PEERS + 1))
head -c 32 /dev/urandom | base64 > "$OUT/secret"
chmod 600 "$OUT/secret"
export OMP_WAIT_POLICY=passive
PIDS=""
cleanup() {
    for p in $PIDS; do kill -KILL "$p" 2> /dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ARGS="--model $MODEL --width $WIDTH --cifar-stem --image-size $SIZE \
--threads 1 --data-threads 1 --quiet --data synthetic:2000 --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout 10 --iters $ITERS"
PORT=$((30000 + $$ % 20000))

# one NAME MODE [BINARY]: a run; MODE catchup or whole.
one() {
    _bin=${3:-$MESHTRAIN}
    _m=$OUT/$1.metrics
    rm -f "$_m" "$OUT/$1".p*.log
    _load=$(cut -d' ' -f1 /proc/loadavg)
    PIDS=""
    if [ "$2" = whole ]; then
        export MESHTRAIN_NO_CATCHUP=1
    else
        unset MESHTRAIN_NO_CATCHUP
    fi
    _r=0
    while [ $_r -lt "$PEERS" ]; do
        # shellcheck disable=SC2086
        "$_bin" -H "localhost:$SLOTS" --rank $_r --port "$PORT" \
            --secret-file "$OUT/secret" $ARGS --join-timeout 3 \
            --metrics "$_m" > "$OUT/$1.p$_r.log" 2>&1 &
        PIDS="$PIDS $!"
        _r=$((_r + 1))
    done
    _i=0
    until grep -q "\"step\": $AT," "$_m" 2> /dev/null || [ $_i -ge 600 ]; do
        sleep 0.1
        _i=$((_i + 1))
    done
    # shellcheck disable=SC2086
    "$_bin" -H "localhost:$SLOTS" --rank "$PEERS" --port "$PORT" \
        --secret-file "$OUT/secret" $ARGS --join-timeout 60 \
        > "$OUT/$1.p$PEERS.log" 2>&1 &
    PIDS="$PIDS $!"
    wait
    PIDS=""
    echo "$_load $(cut -d' ' -f1 /proc/loadavg)" > "$OUT/$1.load"
    PORT=$((PORT + SLOTS + 1))
    python3 "$top/bench/join_pause.py" "$_m" "$OUT/$1.p$PEERS.log" "$1" |
    tee -a "$OUT/summary.txt"
}

{
    echo "bench/catchup.sh: $PEERS peers on this host, $MODEL width $WIDTH" \
        "at ${SIZE}x$SIZE; slot $PEERS joins at step $AT"
    echo "load: $(uptime)"
    printf '%-8s %7s %8s %8s %8s %8s %10s %10s %8s %8s %7s\n' run \
        step_s during_s gap_s pause_s view_s sent_B state_B snap_at \
        admit_at join_s
} | if [ "$START" -gt 1 ]; then tee -a "$OUT/summary.txt"; else
    tee "$OUT/summary.txt"; fi
i=$START
while [ "$i" -lt $((START + RUNS)) ]; do
    one "c$i" catchup
    one "w$i" whole
    if [ -n "$BASE" ]; then
        one "bc$i" catchup "$BASE"
        one "bw$i" whole "$BASE"
    fi
    i=$((i + 1))
done
python3 "$top/bench/catchup_summary.py" "$OUT" "$PEERS" |
    tee -a "$OUT/summary.txt"
