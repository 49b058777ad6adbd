#!/bin/sh
# tests/bench_scaling_plot.sh: bench/scaling_plot.py's table on made-up
# raw points of the seed's topology (8 GPUs per host, 4 per process):
# series keyed by topology, ranks counted per process, efficiency from the
# series' own N = 1, and an earlier run's CSV (--extra-csv, one peer per
# NIC) copied beside them, only the series --extra-series names.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

command -v python3 >/dev/null || t_skip_all "python3 not found"
t_plan 6

# point SERIES N PROCESSES T_STEP RANKS: raw/SERIES-N, RANKS rank outputs
point() {
    _d=$TMP/raw/$1-$2
    mkdir -p "$_d"
    printf '%s\n' "series=$1" "peers=$2" k=64 rate=156250kbit profile=k80 \
        peers_per_host=8 gpus_per_process=4 "processes=$3" steps=4 \
        warmup=1 rc=0 cores=2 busy_jiffies=10 total_jiffies=100 \
        "loadavg=1 1 1" nice=0 rt=1 shm_spin_us=0 >"$_d/meta"
    for s in 1 2 3 4 5; do
        echo "{\"step\": $s, \"t_step\": $4}"
    done >"$_d/metrics.jsonl"
    _r=0
    while [ $_r -lt "$5" ]; do
        echo "meshtrain: rank $_r: simulate: 5 steps, compute stretch" \
            "median 0.500 ms, wait lateness median 0.100 ms max 0.200 ms," \
            "cpu 10.0 ms/step, 4 GPU(s), grads 00000000000000aa" \
            >"$_d/rank$_r.out"
        _r=$((_r + 1))
    done
}
point ring 1 1 0.70 1
point hier 1 1 0.70 1
point hier 16 4 0.72 4
point hier 32 8 0.75 7
cat >"$TMP/old.csv" <<'CSV'
series,peers,k,tbf_rate,profile,steps,t_iter_s,img_per_s,efficiency,valid,why_invalid
ring,1,64,156250kbit,k80,10,0.7053,45.4,1.000,1,
ring,64,64,156250kbit,k80,10,1.3550,1511.4,0.521,0,"simulated compute 2.1 ms longer than profiled (median, worst rank)"
auto,1,64,156250kbit,k80,10,0.7053,45.4,1.000,1,
CSV
python3 "$top_srcdir/bench/scaling_plot.py" --raw "$TMP/raw" \
    --seed "$top_srcdir/bench/seed-benchmark.csv" --csv "$TMP/out.csv" \
    --extra-csv "$TMP/old.csv" --extra-series ring >"$TMP/log" 2>&1
t_ok $? "the table of 4 points and 2 earlier ones is written"

# field SERIES PEERS PEERS_PER_HOST COLUMN: that row's value
field() {
    python3 - "$TMP/out.csv" "$@" <<'PY'
import csv, sys
path, s, n, pph, col = sys.argv[1:]
for r in csv.DictReader(open(path)):
    if (r["series"], r["peers"], str(r["peers_per_host"])) == (s, n, pph):
        print(r[col])
PY
}
[ "$(field hier 16 8 processes)/$(field hier 16 8 gpus_per_process)" = 4/4 ] &&
    [ "$(field hier 16 8 efficiency)" = 0.972 ] &&
    [ "$(field hier 16 8 valid)" = 1 ]
t_ok $? "16 GPUs as 4 processes: efficiency 0.70 / 0.72 against its own N = 1, valid"
[ "$(field hier 32 8 valid)" = 0 ] &&
    field hier 32 8 why_invalid | grep -q "7 of 8 ranks reported"
t_ok $? "32 GPUs as 8 processes with 7 reports: invalid ($(field hier 32 8 why_invalid))"
[ "$(field ring 1 8 valid)" = 1 ] && [ "$(field ring 1 8 comm_ms)" = 0.0 ]
t_ok $? "the topology's N = 1 point is its own series' baseline"
[ "$(field ring 64 1 efficiency)" = 0.521 ] && [ "$(field ring 64 1 valid)" = 0 ] &&
    [ "$(field ring 64 1 gpus_per_process)" = 1 ]
t_ok $? "--extra-csv: the one-peer-per-NIC ring rows copied as measured"
[ -z "$(field auto 1 1 valid)" ]
t_ok $? "--extra-series ring: the earlier auto rows left out"
t_done
