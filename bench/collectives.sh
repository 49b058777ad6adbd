#!/bin/sh
# collectives.sh: meshbench's all-reduce against Open MPI and Gloo and the
# TCP limit, side by side in one run, with the same sizes and peer counts.
#
#   bench/collectives.sh [--settings a,b,c] [--np 2,4,8] [--sizes SIZES]
#                        [--systems mesh,meshtcp,mpi,vader,gloo,tcp,mem,
#                                   autovs]
#                        [--algos ring,tree,auto]
#                        [--rotate] [--rotate-algos A,B]
#                        [--time S] [--repeat R] [--quick] [--out DIR]
#                        [--builddir DIR] [--mesh-args "ARGS"]
#                        [--prefix P] [--rate R] [--mtu M] [--cc CC]
#                        [--mesh-cc CC] [--peers-per-host P] [--insecure]
#
# Settings: a loopback (N processes on 127.0.0.1), b N network-namespace
# hosts on a bridge (scripts/netns.sh), c the same with each host's egress
# shaped to R (default 1gbit) by tbf; --mtu M gives b and c links of MTU M
# (e.g. 9000, jumbo frames; the setting's name gets -mtuM); --cc CC makes
# every host's namespace default to TCP congestion control CC (e.g.
# cubic), so that all four systems run under it (b and c only; the name
# gets -CC). --mesh-cc CC has meshbench (--tcp-congestion CC) and the TCP
# limit's iperf3 (-C CC) choose CC for their own sockets, in any setting,
# while Open MPI and Gloo, which cannot choose, keep the host's default;
# the name gets -mesh-CC. --peers-per-host P puts P peers on each
# namespace host (b and c; N / P hosts, each with its one NIC, shaped in
# c: the seed's 8 GPUs behind one NIC); the name gets -Ppph; the TCP limit
# is then not run, and vader is Open MPI with btl self,vader,tcp. For
# every setting and N it runs:
#   tcp   bench/tcp_limit.sh: iperf3 ring of N streams (and --bidir for
#         N = 2), single stream, ping RTT
#   mpi   bench/mpi_allreduce (MPI_Allreduce, mpirun --mca btl tcp,self
#         --mca pml ob1; namespaces through bench/netns_rsh.sh)
#   gloo  bench/gloo_allreduce.py (torch.distributed "gloo", one process
#         per host, GLOO_SOCKET_IFNAME set)
#   vader Open MPI with --mca btl self,vader (its shared memory, single
#         copy where the kernel allows it), loopback only
#   mesh  $builddir/meshbench --op allreduce --algo A for each A in
#         --algos, one process per host started directly with --rank; it
#         is skipped, saying so, while meshbench has no all-reduce. Its
#         default transport: shared memory within a host, TCP between.
#   meshtcp  the same with --transport tcp --algo ring (flat, over TCP
#         even within a host: what meshbench did before shm), as
#         mesh-tcp-ring, which is not counted as meshbench's best
#   autovs  meshbench --vs-fixed (not by default): auto against every
#         fixed algorithm it chooses from, taking turns run by run in one
#         run, so that load from elsewhere hits them alike; auto's time
#         over the best fixed one's per size goes to DIR/auto_vs_fixed.csv
#         and the worst ratio per setting and N is printed at the end;
#         with --repeat R also, per size, the median ratio over the
#         repetitions with its spread, and the median of chosen/best
#         (the fixed run of auto's algorithm over the best fixed one)
#         --rotate: autovs runs meshbench --rotate instead (and runs even
#         when --systems does not name it): every run of the rotation
#         timed, per size each one's median and auto/best as the median
#         of the rounds' paired ratios with a 95 % interval and a verdict
#         (ok: the interval at or below 1.03; over: above it; ?: holds
#         it), into DIR/auto_rotate.csv and a table at the end;
#         --rotate-algos A,B: only these fixed algorithms beside auto
#         (meshbench --algos; default: every one auto chooses from)
#   mem   bench/mem_limit.py: memcpy and a float32 sum y += x, 1 and 2
#         processes, the machine's memory-bandwidth limit (loopback only)
# SIZES: "MIN:MAX:FACTOR" (default 4K:256M:4) or a list "4K,64M" (one run
# per size unless the list is geometric). --time S: target seconds per
# size and system (default 1). --repeat R: every system R times in turn,
# interleaved, so that load from elsewhere hits all of them alike; the
# report takes each one's best (default 1). --mesh-args: extra meshbench
# arguments, e.g. "-n 5 -w 1 --streams 2"; meshbench gets -t S like the
# others (its -n is then the least number of iterations: lower it for slow
# settings).
# --quick = --settings a,b --np 2,4 --sizes 4K,64M --time 0.5.
# Ports: BL_PORT (environment) + 0..59, by default chosen from the pid.
#
# Writes (DIR defaults to bench/out):
#   DIR/collectives.csv  setting,np,system,size,time_us,algbw,busbw,wrong,
#                        rep
#   DIR/auto_vs_fixed.csv  setting,np,size,auto_algo,auto_us,best_algo,
#                        best_us,ratio,rep,chosen_us (autovs; chosen_us:
#                        the fixed run of the algorithm auto ran)
#   DIR/auto_rotate.csv  setting,np,size,auto_algo,rounds,auto_us,best_algo,
#                        best_us,ratio,lo,hi,verdict,rep (--rotate; the
#                        times are medians over the rounds, ratio the
#                        median of auto/best per round, lo..hi its 95 %
#                        interval)
#   DIR/tcp_limit.csv    setting,np,ring_link_GBps,ring_min_GBps,
#                        bidir_dir_GBps,single_GBps,ping_rtt_us,limit_GBps,
#                        rep
#   DIR/cpu.csv          setting,np,system,sizes,busy_pct,user_pct,
#                        steal_pct,steal_max_pct,rep: the machine's CPU
#                        while each system ran (bench/lib.sh, bl_cpu_stop;
#                        system tcp-limit: the TCP limit's iperf3 runs)
#   DIR/collectives.png  busbw vs size, one panel per setting and N, one
#                        line per system, the TCP limit dashed
#   DIR/raw/*.txt        every tool's own output
# and prints meshbench's busbw against the better anchor and the TCP limit
# per size, the 4 KiB all-reduce times, and whether meshbench met each of
# the collectives issue's goals (bench/report_collectives.py).
# Exit status: 0, or 1 when a system failed or reported wrong values (the
# others still run). Needs root for settings b and c.

set -u
. "$(dirname "$0")/lib.sh"

settings=a,b,c
nps=2,4,8
sizes=4K:256M:4
systems=mesh,meshtcp,mpi,vader,gloo,tcp,mem
algos=ring,tree,auto
secs=1
repeat=1
outdir="$bl_srcdir/bench/out"
builddir=${top_builddir:-$bl_srcdir}
insecure=0
meshargs=
rotate=0
rotalgos=
while [ $# -gt 0 ]; do
    case $1 in
        --settings) settings=$2; shift 2 ;;
        --np) nps=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --systems) systems=$2; shift 2 ;;
        --algos) algos=$2; shift 2 ;;
        --quick) settings=a,b nps=2,4 sizes=4K,64M secs=0.5; shift ;;
        --mesh-args) meshargs=$2; shift 2 ;;
        --rotate) rotate=1; shift ;;
        --rotate-algos) rotalgos=$2; shift 2 ;;
        -h|--help) bl_help; exit 0 ;;
        *) bl_opt "--time --repeat --out --builddir --prefix --rate --mtu \
--cc --mesh-cc --peers-per-host --insecure" "$@" ||
               { echo "collectives.sh: unknown argument '$1' (see --help)" >&2
                 exit 2; }
           shift "$BL_SHIFT" ;;
    esac
done

has() { case ",$1," in *",$2,"*) return 0 ;; esac; return 1; }
[ $rotate -eq 1 ] && ! has "$systems" autovs && systems="$systems,autovs"
[ -n "$rotalgos" ] && [ $rotate -eq 0 ] &&
    { echo "collectives.sh: --rotate-algos needs --rotate" >&2; exit 2; }
for s in $(echo "$settings" | tr , ' '); do
    bl_setting_name "$s" >/dev/null ||
        { echo "collectives.sh: unknown setting '$s' (a, b, c)" >&2; exit 2; }
done
bl_cc_check "$settings"
case $repeat in ''|*[!0-9]*|0) echo "collectives.sh: bad --repeat '$repeat'" >&2
                             exit 2 ;; esac
for n in $(echo "$nps" | tr , ' '); do
    case $n in ''|*[!0-9]*) echo "collectives.sh: bad --np '$n'" >&2
                            exit 2 ;; esac
    [ "$n" -ge 2 ] || { echo "collectives.sh: --np values must be >= 2" >&2
                        exit 2; }
    [ $((n % BL_PPH)) -eq 0 ] ||
        { echo "collectives.sh: --np $n is not a multiple of" \
               "--peers-per-host $BL_PPH" >&2; exit 2; }
done

# Sizes -> "b e f" triples, one per run.
runs=$(python3 - "$sizes" <<'EOF'
import sys
def b(s):
    m = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:].lower(), 1)
    v = int(s[:-1] if m > 1 else s) * m
    if v < 4 or v % 4:
        raise ValueError("size %r: need a multiple of 4 bytes" % s)
    return v
try:
    spec = sys.argv[1]
    if ":" in spec:
        lo, hi, f = spec.split(":")
        lo, hi, f = b(lo), b(hi), int(f)
        if hi < lo or f < 2:
            raise ValueError("need MIN <= MAX and FACTOR >= 2")
        print(lo, hi, f)
    else:
        v = [b(s) for s in spec.split(",")]
        if sorted(v) != v:
            raise ValueError("list sizes in increasing order")
        r = {v[i + 1] // v[i] for i in range(len(v) - 1)}
        if len(v) > 1 and len(r) == 1 and all(
                v[i + 1] == v[i] * min(r) for i in range(len(v) - 1)) \
                and min(r) >= 2:
            print(v[0], v[-1], min(r))
        else:
            for x in v:
                print(x, x, 2)
except Exception as e:
    sys.stderr.write("collectives.sh: bad --sizes %r: %s\n" % (sys.argv[1], e))
    sys.exit(2)
EOF
) || exit 2

mkdir -p "$outdir/raw" || exit 1
csv="$outdir/collectives.csv"
lcsv="$outdir/tcp_limit.csv"
ccsv="$outdir/cpu.csv"
echo "setting,np,system,size,time_us,algbw,busbw,wrong,rep" >"$csv"
echo "setting,np,system,sizes,busy_pct,user_pct,steal_pct,steal_max_pct,rep" \
    >"$ccsv"
vcsv="$outdir/auto_vs_fixed.csv"
echo "setting,np,size,auto_algo,auto_us,best_algo,best_us,ratio,rep,$(
    )chosen_us" >"$vcsv"
rcsv="$outdir/auto_rotate.csv"
[ $rotate -eq 1 ] &&
    echo "setting,np,size,auto_algo,rounds,auto_us,best_algo,best_us,$(
        )ratio,lo,hi,verdict,rep" >"$rcsv"
echo "setting,np,ring_link_GBps,ring_min_GBps,bidir_dir_GBps,single_GBps,$(
    )ping_rtt_us,limit_GBps,rep" >"$lcsv"
tmp=$(mktemp -d /tmp/collectives.XXXXXX) || exit 1
cleanup() {
    bl_cpu_abort
    bl_teardown
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
status=0

# Each system's run is bounded: a hang costs at most this long.
runlimit=600

# --- what can run ---------------------------------------------------------
mpibin=
if has "$systems" mpi || has "$systems" vader; then
    if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
        mpibin="$tmp/mpi_allreduce"
        if [ -x "$builddir/bench/mpi_allreduce" ]; then
            mpibin="$builddir/bench/mpi_allreduce"
        elif ! mpicc -O2 -o "$mpibin" "$bl_srcdir/bench/mpi_allreduce.c"; then
            bl_log "mpicc failed: skipping Open MPI"
            mpibin=
            status=1
        fi
    else
        bl_log "mpicc/mpirun not found (apt-get install openmpi-bin" \
               "libopenmpi-dev): skipping Open MPI"
    fi
fi
gloo=0
if has "$systems" gloo; then
    if /usr/bin/python3 -c 'import torch.distributed as d
assert d.is_gloo_available()' 2>/dev/null; then
        gloo=1
    else
        bl_log "/usr/bin/python3 has no torch with gloo (apt-get install" \
               "python3-torch): skipping Gloo"
    fi
fi
mesh=0
meshbench="$builddir/meshbench"
if { has "$systems" mesh || has "$systems" autovs; } &&
    bl_meshbench_has "$meshbench" allreduce "skipping meshbench"; then
    mesh=1
fi
secret="$tmp/secret"
( umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$secret" ) ||
    exit 1
if [ $insecure -eq 1 ]; then
    meshauth="--insecure"
else
    meshauth="--secret-file $secret"
fi

# --- one system at a time ----------------------------------------------------
# Port bases differ per system (lib.sh's BL_PORT + 0, 20, 40) so that a
# straggler never meets the next run.
run_mpi() {   # setting np b e f log [vader]
    _n=$2
    if [ "$1" = a ] && [ "${7:-}" = vader ]; then
        timeout $runlimit mpirun --allow-run-as-root --oversubscribe \
            -np "$_n" --mca btl self,vader --mca pml ob1 \
            "$mpibin" -b "$3" -e "$4" -f "$5" -t "$secs" >"$6" 2>&1
    elif [ "$1" = a ]; then
        timeout $runlimit mpirun --allow-run-as-root --oversubscribe \
            -np "$_n" --mca btl tcp,self --mca pml ob1 \
            --mca btl_tcp_if_include 127.0.0.1/8 \
            "$mpibin" -b "$3" -e "$4" -f "$5" -t "$secs" >"$6" 2>&1
    else
        _hf="$tmp/hostfile.mpi"
        _btl=tcp,self
        [ "${7:-}" = vader ] && _btl=self,vader,tcp
        bl_hostfile "$_hf" "$_n"
        # mpirun itself runs on host 1, so the orteds it starts in the
        # other namespaces can reach it at 10.77.0.1.
        timeout $runlimit ip netns exec "${BL_PREFIX}1" env \
            OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            MT_NETNS_PREFIX="$BL_PREFIX" \
            mpirun --hostfile "$_hf" -np "$_n" --oversubscribe \
            --mca plm_rsh_agent "$bl_srcdir/bench/netns_rsh.sh" \
            --mca plm_rsh_no_tree_spawn 1 \
            --mca btl "$_btl" --mca pml ob1 \
            --mca btl_tcp_if_include 10.77.0.0/24 \
            --mca oob_tcp_if_include 10.77.0.0/24 \
            "$mpibin" -b "$3" -e "$4" -f "$5" -t "$secs" >"$6" 2>&1
    fi
}

run_gloo() {   # setting np b e f log
    _n=$2
    _r=0
    while [ $_r -lt "$_n" ]; do
        _out=/dev/null
        [ $_r -eq 0 ] && _out=$6
        bl_bg $((_r + 1)) env GLOO_SOCKET_IFNAME="$(bl_ifname)" \
            timeout $runlimit /usr/bin/python3 \
            "$bl_srcdir/bench/gloo_allreduce.py" --rank $_r --world "$_n" \
            --master "$(bl_addr 1)" --port $((BL_PORT + 20)) \
            -b "$3" -e "$4" -f "$5" -t "$secs" >"$_out" 2>"$tmp/gloo.err.$_r"
        _r=$((_r + 1))
    done
    bl_wait_bg $((runlimit + 10))
    _rc=$?
    cat "$tmp"/gloo.err.* >>"$6" 2>/dev/null
    rm -f "$tmp"/gloo.err.*
    return $_rc
}

run_mesh() {   # setting np b e f log algo [extra meshbench arguments]
    _n=$2
    _hf="$tmp/hostfile.mesh"
    if [ "$1" = a ]; then
        echo "127.0.0.1 slots=$_n" >"$_hf"
    else
        bl_hostfile "$_hf" "$_n"
    fi
    _r=0
    while [ $_r -lt "$_n" ]; do
        bl_bg $((_r + 1)) timeout $runlimit "$meshbench" --hostfile "$_hf" \
            --rank $_r --port "$BL_PORT" $meshauth --op allreduce \
            --algo "$7" -b "$3" -e "$4" -f "$5" -t "$secs" $meshargs ${8:-} \
            ${BL_MESH_CC:+--tcp-congestion "$BL_MESH_CC"} \
            >"$tmp/mesh.out.$_r" 2>&1
        _r=$((_r + 1))
    done
    bl_wait_bg $((runlimit + 10))
    _rc=$?
    # nccl-tests print the table on rank 0; keep the others' lines after.
    cat "$tmp/mesh.out.0" >"$6"
    _r=1
    while [ $_r -lt "$_n" ]; do
        sed "s/^/[rank $_r] /" "$tmp/mesh.out.$_r" >>"$6"
        _r=$((_r + 1))
    done
    rm -f "$tmp"/mesh.out.*
    return $_rc
}

# record SYSTEM SETTING NP LOG RC REP SIZES: parse LOG into the CSV, check
# it; the CPU use bl_cpu_stop measured meanwhile ($tmp/cpu.txt) goes to
# cpu.csv.
record() {
    bl_cpu_stop "$tmp/cpu.txt" | awk -v s="$2" -v n="$3" -v y="$1" \
        -v z="$7" -v r="$6" '
        { printf "%s,%s,%s,%s,%s,%s,%s,%s,%s\n", s, n, y, z, $1, $2, $3,
                 $4, r }' >>"$ccsv"
    _rows=$(bl_parse_table "$1" "$2" "$3" <"$4" | sed "s/\$/,$6/")
    if [ -z "$_rows" ]; then
        bl_log "$1 ($2, N=$3) printed no results (exit $5): see $4"
        tail -n 5 "$4" | sed 's/^/    /' >&2
        status=1
        return
    fi
    echo "$_rows" >>"$csv"
    if [ "$5" -ne 0 ]; then
        bl_log "$1 ($2, N=$3) exited with status $5: see $4"
        status=1
    fi
    if echo "$_rows" | awk -F, '$8 != "" && $8 != 0 { bad = 1 }
                                END { exit !bad }'; then
        bl_log "$1 ($2, N=$3) reported wrong values: see $4"
        status=1
    fi
}

# measure WHAT FILE SYSTEM [ALGO]: one system's run over the sizes $b..$e
# of one_round's setting $rset with $rnp hosts, its CPU use measured
# meanwhile; the output goes to raw/TAG-FILE-SIZES.txt, the results to the
# CSV as SYSTEM's (meshbench-ALGO: meshbench --algo ALGO).
measure() {
    bl_log "  $1, $b..$e bytes"
    log="$outdir/raw/$rtag-$2-$b-$e.txt"
    bl_cpu_start "$tmp/cpu.txt"
    case $3 in
        openmpi) run_mpi "$rset" "$rnp" "$b" "$e" "$f" "$log" ;;
        openmpi-vader) run_mpi "$rset" "$rnp" "$b" "$e" "$f" "$log" vader ;;
        gloo) run_gloo "$rset" "$rnp" "$b" "$e" "$f" "$log" ;;
        *) run_mesh "$rset" "$rnp" "$b" "$e" "$f" "$log" "$4" "${5:-}" ;;
    esac </dev/null
    record "$3" "$rname" "$rnp" "$log" $? "$rrep" "$b-$e"
}

# measure_rotate: meshbench --rotate over the sizes $b..$e of one_round's
# setting; its rows go to auto_rotate.csv.
measure_rotate() {
    bl_log "  meshbench --rotate (auto against each fixed algorithm, every" \
           "run timed), $b..$e bytes"
    log="$outdir/raw/$rtag-mesh-rotate-$b-$e.txt"
    run_mesh "$rset" "$rnp" "$b" "$e" "$f" "$log" auto \
        "--rotate ${rotalgos:+--algos $rotalgos}" </dev/null
    _rc=$?
    _rows=$(awk -v s="$rname" -v n="$rnp" -v r="$rrep" '
        $1 == "#" && $2 == "size" && $3 == "algo" && $4 == "rounds" {
            hdr = NF; for (i = 5; i <= NF - 5; i++) name[i - 1] = $i; next }
        hdr && NF == hdr - 1 && $1 ~ /^[0-9]+$/ {
            bt = ""
            for (i = 5; i <= NF - 5; i++) if (name[i] == $(NF - 4)) bt = $i
            printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", s, n, $1,
                   $2, $3, $4, $(NF - 4), bt, $(NF - 3), $(NF - 2),
                   $(NF - 1), $NF, r }' "$log")
    if [ -z "$_rows" ] || [ $_rc -ne 0 ]; then
        bl_log "meshbench --rotate ($rname, N=$rnp) failed (exit $_rc):" \
               "see $log"
        status=1
    fi
    [ -n "$_rows" ] && echo "$_rows" >>"$rcsv"
}

# measure_vs: meshbench --vs-fixed over the sizes $b..$e of one_round's
# setting; its rows go to auto_vs_fixed.csv.
measure_vs() {
    bl_log "  meshbench --vs-fixed (auto against each fixed algorithm)," \
           "$b..$e bytes"
    log="$outdir/raw/$rtag-mesh-vs-fixed-$b-$e.txt"
    run_mesh "$rset" "$rnp" "$b" "$e" "$f" "$log" auto --vs-fixed </dev/null
    _rc=$?
    _rows=$(awk -v s="$rname" -v n="$rnp" -v r="$rrep" '
        $1 == "#" && $2 == "size" && $3 == "algo" && $4 == "auto" {
            hdr = NF; for (i = 5; i <= NF - 2; i++) name[i - 1] = $i; next }
        hdr && NF == hdr - 1 && $1 ~ /^[0-9]+$/ {
            bt = ""; ct = ""
            for (i = 4; i <= NF - 2; i++) {
                if (name[i] == $(NF - 1)) bt = $i
                if (name[i] == $2) ct = $i }
            printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", s, n, $1, $2, $3,
                   $(NF - 1), bt, $NF, r, ct }' "$log")
    if [ -z "$_rows" ] || [ $_rc -ne 0 ]; then
        bl_log "meshbench --vs-fixed ($rname, N=$rnp) failed (exit $_rc):" \
               "see $log"
        status=1
    fi
    [ -n "$_rows" ] && echo "$_rows" >>"$vcsv"
}

# one_round SETTING NAME NP TAG REP: every system once, sizes as asked.
one_round() {
    rset=$1 rname=$2 rnp=$3 rtag=$4 rrep=$5
    if has "$systems" tcp && [ "$BL_PPH" -gt 1 ] && [ "$1" != a ]; then
        bl_log "  TCP limit: not run with --peers-per-host (one stream per" \
               "host)"
    elif has "$systems" tcp; then
        bl_log "  TCP limit (iperf3, ping)"
        "$bl_srcdir/bench/tcp_limit.sh" --setting "$1" --np "$3" \
            --no-setup --prefix "$BL_PREFIX" --rate "$BL_RATE" \
            ${BL_MESH_CC:+--mesh-cc "$BL_MESH_CC"} \
            --port $((BL_PORT + 40)) \
            >"$outdir/raw/$4-tcp.txt" 2>&1 </dev/null || status=1
        awk -v s="$2" -v n="$3" -v r="$5" -v cpu="$ccsv" '
            { v[$1] = $2 }
            END { printf "%s,%s,%s,%s,%s,%s,%s,%s,%s\n", s, n,
                  v["ring_link_GBps"], v["ring_min_GBps"],
                  v["bidir_dir_GBps"], v["single_GBps"],
                  v["ping_rtt_us"], v["limit_GBps"], r
                  printf "%s,%s,tcp-limit,,%s,%s,%s,%s,%s\n", s, n,
                  v["limit_busy_pct"], v["limit_user_pct"],
                  v["limit_steal_pct"], v["limit_steal_max_pct"],
                  r >>cpu }' \
            "$outdir/raw/$4-tcp.txt" >>"$lcsv"
    fi
    if [ "$1" = a ] && has "$systems" mem && [ "$5" = 1 ]; then
        bl_log "  memory-bandwidth limit (memcpy, sum; 1 and 2 processes)"
        /usr/bin/python3 "$bl_srcdir/bench/mem_limit.py" \
            >"$outdir/mem_limit.txt" 2>&1 </dev/null || status=1
        sed 's/^/    /' "$outdir/mem_limit.txt" >&2
    fi
    while read -r b e f; do
        [ -n "$mpibin" ] && measure "Open MPI" mpi openmpi
        [ -n "$mpibin" ] && has "$systems" vader &&
            { [ "$1" = a ] || [ "$BL_PPH" -gt 1 ]; } &&
            measure "Open MPI (btl self,vader)" mpi-vader openmpi-vader
        [ $mesh -eq 1 ] && has "$systems" meshtcp &&
            measure "meshbench --transport tcp --algo ring" mesh-tcp-ring \
                mesh-tcp-ring ring "--transport tcp"
        [ $gloo -eq 1 ] && measure Gloo gloo gloo
        if [ $mesh -eq 1 ] && has "$systems" autovs; then
            if [ $rotate -eq 1 ]; then measure_rotate; else measure_vs; fi
        fi
        if [ $mesh -eq 1 ] && has "$systems" mesh; then
            for a in $(echo "$algos" | tr , ' '); do
                measure "meshbench --algo $a" "mesh-$a" "meshbench-$a" "$a"
            done
        fi
    done <"$tmp/runs"
}

for s in $(echo "$settings" | tr , ' '); do
    sname=$(bl_setting_name "$s")
    if [ "$s" != a ]; then
        why=$("$BL_NETNS" check --prefix "$BL_PREFIX")
        if [ $? -ne 0 ]; then
            bl_log "setting $s ($sname) skipped: $why"
            continue
        fi
    fi
    for n in $(echo "$nps" | tr , ' '); do
        bl_log "setting $s ($sname), N=$n"
        bl_load
        bl_setup "$s" "$n" || { status=1; continue; }
        echo "$runs" >"$tmp/runs"
        r=1
        while [ $r -le "$repeat" ]; do
            tag="$s-$n-r$r"
            [ "$repeat" -gt 1 ] && bl_log "  repetition $r of $repeat"
            one_round "$s" "$sname" "$n" "$tag" "$r"
            r=$((r + 1))
        done
        bl_teardown
    done
done

bl_load
if [ "$(wc -l <"$vcsv")" -gt 1 ]; then
    echo "auto against the best fixed algorithm (auto's time / best's;" \
         "goal <= 1.03):"
    awk -F, 'NR > 1 { k = $1 " N=" $2; if ($8 > w[k]) { w[k] = $8
                      at[k] = $3 " B (" $4 " vs " $6 ")" } }
             END { for (k in w) printf "  %-34s worst %.3f at %s\n", k,
                   w[k], at[k] }' "$vcsv" | sort
fi
# With --repeat R: per size, the median over the repetitions of auto/best
# (its spread, least..most), of chosen/best, the fixed run of the
# algorithm auto ran over the best fixed one (1 where auto chose the best:
# the choice, without auto's own run's noise), and of auto/chosen ("self":
# one algorithm's two runs, the noise; the best of several columns is
# biased low, so auto/best exceeds 1 by noise alone); per setting and N
# the worst median.
if [ "$repeat" -gt 1 ] && [ "$(wc -l <"$vcsv")" -gt 1 ]; then
    echo "over the $repeat repetitions, per size: median auto/best" \
         "(least..most), median chosen/best, median auto/chosen (self)," \
         "auto's algorithms:"
    awk -F, '
    function med(s,   a, n, i, j, x) {
        n = split(s, a, " ")
        for (i = 2; i <= n; i++) {
            x = a[i] + 0
            for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]
            a[j + 1] = x }
        lo = a[1]; hi = a[n]
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    NR > 1 && $8 > 0 {
        k = $1 " N=" $2 " " sprintf("%10d", $3)
        r[k] = r[k] " " $8
        if ($10 > 0 && $7 > 0) c[k] = c[k] " " $10 / $7
        if ($10 > 0 && $5 > 0) u[k] = u[k] " " $5 / $10
        if (index("," al[k] ",", "," $4 ",") == 0)
            al[k] = al[k] (al[k] == "" ? "" : ",") $4 }
    END {
        for (k in r) {
            m = med(r[k]); l = lo; h = hi
            cm = c[k] == "" ? 0 : med(c[k])
            um = u[k] == "" ? 0 : med(u[k])
            printf "  %-40s %.3f (%.3f..%.3f)  chosen %.3f  self %.3f  %s\n",
                   k, m, l, h, cm, um, al[k]
            split(k, kk, " "); g = kk[1] " " kk[2]
            if (m > wm[g]) { wm[g] = m; wat[g] = kk[3] } }
        for (g in wm)
            printf "  %-30s worst median auto/best %.3f at %s B\n", g,
                   wm[g], wat[g] }' "$vcsv" | sort
fi
if [ $rotate -eq 1 ] && [ "$(wc -l <"$rcsv")" -gt 1 ]; then
    echo "auto against the best fixed algorithm, rotated run by run" \
         "(meshbench --rotate): median of auto/best over the rounds," \
         "95 % interval, verdict (ok: <= 1.03 shown; over: > 1.03 shown)"
    printf '  %-22s %3s %10s %3s %6s %6s %7s %7s %6s %6s %s\n' setting \
        N size rep auto best rounds ratio lo hi verdict
    awk -F, 'NR > 1 {
        printf "  %-22s %3s %10s %3s %6s %6s %7s %7s %6s %6s %6s\n", $1,
               $2, $3, $13, $4, $7, $5, $9, $10, $11, $12
        k = $1 " N=" $2; v[k, $12]++; all[k]++ }
        END { for (k in all)
                  printf "  %-30s ok %d, over %d, ? %d of %d sizes\n", k,
                         v[k, "ok"], v[k, "over"], v[k, "?"], all[k] }' \
        "$rcsv"
fi
[ "$(wc -l <"$csv")" -gt 1 ] || exit $status
/usr/bin/python3 "$bl_srcdir/bench/report_collectives.py" "$csv" "$lcsv" \
    "$outdir/collectives.png" "$ccsv" || status=1
exit $status
