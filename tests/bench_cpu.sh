#!/bin/sh
# tests/bench_cpu.sh: the bench scripts' CPU accounting (bench/lib.sh's
# bl_cpu_start/bl_cpu_stop and report_collectives.py's CPU lines), which
# tells a CPU-bound or hypervisor-disturbed benchmark run from a slow
# system. Checks the arithmetic on /proc/stat samples made up here, the
# sampler on the real /proc/stat (numbers in range, nothing left running),
# and the report's CPU line and steal warning on made-up CSVs.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"
. "$top_srcdir/bench/lib.sh"

t_plan 6

# Three half-second windows, in ticks (user nice system idle iowait irq
# softirq steal): 50/30/20 idle, no steal: busy 80 %, user 50 %;
# 10/10/60 idle and 20 stolen: of the 80 left, busy 25 %, user 12.5 %;
# 40/50/0 idle, 10 softirq: busy 100 %, user 40 %. Medians 80 and 40;
# stolen 20 of 300 ticks, 6.7 %, at worst 20 % of a window.
f=$TMP/stat
cat >"$f" <<'EOF'
cpu  1000 0 2000 3000 0 0 500 100 0 0
cpu  1050 0 2030 3020 0 0 500 100 0 0
cpu  1060 0 2040 3080 0 0 500 120 0 0
cpu  1100 0 2090 3080 0 0 510 120 0 0
EOF
got=$(bl_cpu_stop "$f")
t_ok $([ "$got" = "80 40 6.7 20.0" ]; echo $?) \
    "made-up samples: busy 80, user 40, steal 6.7 (worst 20.0): got '$got'"

echo "cpu  1000 0 2000 3000 0 0 500 100 0 0" >"$f"
got=$(bl_cpu_stop "$f")
t_ok $([ "$got" = "nan nan nan nan" ]; echo $?) \
    "a single sample is no measurement: got '$got'"

# The real sampler around a second of one busy loop.
if [ -r /proc/stat ]; then
    bl_cpu_start "$TMP/real"
    pid=$_bl_cpu_pid
    timeout 1.2 sh -c 'while :; do :; done'
    got=$(bl_cpu_stop "$TMP/real")
    ok=$(echo "$got" | awk 'NF == 4 && $1 > 0 && $1 <= 100 && $2 >= 0 &&
                            $2 <= $1 + 1 && $3 >= 0 && $3 <= 100 &&
                            $4 >= $3 { print 0; exit } { print 1 }')
    t_ok "$ok" "a busy loop's run: busy, user, steal in range: '$got'"
    sleep 0.2
    t_ok $(kill -0 "$pid" 2>/dev/null && echo 1 || echo 0) \
        "the sampler (pid $pid) is gone after bl_cpu_stop"
else
    t_skip "no /proc/stat on this system"
    t_skip "no /proc/stat on this system"
fi

# The report: one CPU line per setting and N, and a warning for the run
# that lost more than 2 % to the hypervisor, not for the one whose only
# fault is a half-second spike.
cat >"$TMP/coll.csv" <<'EOF'
setting,np,system,size,time_us,algbw,busbw,wrong,rep
netns,2,gloo,1048576,4000.0,0.262,0.262,0,1
netns,2,meshbench-ring,1048576,1200.0,0.870,0.870,0,1
EOF
cat >"$TMP/lim.csv" <<'EOF'
setting,np,ring_link_GBps,ring_min_GBps,bidir_dir_GBps,single_GBps,ping_rtt_us,limit_GBps,rep
netns,2,1.0,0.9,0.95,1.1,70.0,0.95,1
EOF
cat >"$TMP/cpu.csv" <<'EOF'
setting,np,system,sizes,busy_pct,user_pct,steal_pct,steal_max_pct,rep
netns,2,tcp-limit,,93,3,0.5,1.0,1
netns,2,gloo,1048576-1048576,80,60,1.5,24.0,1
netns,2,meshbench-ring,1048576-1048576,99,13,9.5,31.0,1
EOF
if command -v python3 >/dev/null; then
    python3 "$top_srcdir/bench/report_collectives.py" "$TMP/coll.csv" \
        "$TMP/lim.csv" "$TMP/plot.png" "$TMP/cpu.csv" >"$TMP/report" 2>&1
    rc=$?
    t_ok $([ $rc -eq 0 ] && grep -q \
        'CPU % busy/user, % stolen: tcp-limit 93/3 st 0.5; gloo 80/60 st 1.5; meshbench-ring 99/13 st 9.5' \
        "$TMP/report"; echo $?) "the report's CPU line (exit $rc)"
    t_ok $([ "$(grep -c '^   ! ' "$TMP/report")" -eq 1 ] &&
           grep -q '! meshbench-ring 1048576-1048576 (repetition 1): the hypervisor took 9.5 % of the CPU over the run (up to 31 %' \
               "$TMP/report"; echo $?) \
        "one steal warning, for meshbench-ring's run only"
    [ $rc -eq 0 ] || t_show "$TMP/report"
else
    t_skip "python3 not found"
    t_skip "python3 not found"
fi
t_done
