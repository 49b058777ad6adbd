# bench/lib.sh: shared helpers of the bench scripts (sourced, not run).
#
# A "setting" is where the N hosts live:
#   a  loopback: N processes on this host, 127.0.0.1
#   b  N network namespaces on a bridge (scripts/netns.sh), unshaped
#   c  the same, each host's egress shaped by tbf to $BL_RATE (1gbit)
# $BL_MTU, when set, is the MTU of the namespaces' links (b and c; the
# setting's name then ends in -mtuM). $BL_CC, when set, is the TCP
# congestion control every host's namespace defaults to, so that every
# system measured there uses it (b and c only; the name then ends in -CC).
# $BL_MESH_CC, when set, is the congestion control that meshbench
# (--tcp-congestion) and the TCP limit's iperf3 (-C) give their own
# sockets, in any setting; Open MPI and Gloo, which have no such choice,
# keep the host's (the name then ends in -mesh-CC).
# Host numbers are 1-based. Namespaces use prefix $BL_PREFIX, by default
# "mb" and the script's pid, so that concurrent runs (and the tests) never
# touch each other's hosts.
# Shell functions share the caller's variables: everything here that is
# not part of the interface is named _bl_*.

BL_PREFIX=${BL_PREFIX:-mb$(($$ % 1000000))}
BL_RATE=${BL_RATE:-1gbit}
# Peers per namespace host (settings b and c): N peers on N / BL_PPH hosts,
# which share the host's one NIC (the seed's 8 GPUs behind one NIC).
BL_PPH=${BL_PPH:-1}
BL_MTU=${BL_MTU:-}
BL_CC=${BL_CC:-}
BL_MESH_CC=${BL_MESH_CC:-}
BL_SETTING=
BL_NP=0
bl_srcdir=$(cd "$(dirname "$0")/.." && pwd)
BL_NETNS="$bl_srcdir/scripts/netns.sh"
BL_PIDS=
BL_UP=0
# Ports: each run takes 100 from 10000-28999 by its pid (below Linux's
# ephemeral range and meshtrain's default 29400), so that runs side by
# side do not collide. $BL_PORT sets the base.
BL_PORT=${BL_PORT:-$((10000 + ($$ % 190) * 100))}

bl_log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# The machine's load: what else ran and disturbed the numbers.
bl_load() {
    bl_log "load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" \
           "on $(nproc 2>/dev/null) cores; TCP congestion control" \
           "${BL_CC:-$(cat /proc/sys/net/ipv4/tcp_congestion_control \
           2>/dev/null) (the system default)}" \
           "${BL_MESH_CC:+(meshbench and iperf3: $BL_MESH_CC)}"
}

bl_die() { echo "$(basename "$0"): $*" >&2; exit 1; }

bl_setting_name() {
    _bl_tail=${BL_MTU:+-mtu$BL_MTU}${BL_CC:+-$BL_CC}
    [ "$BL_PPH" -gt 1 ] && _bl_tail="$_bl_tail-${BL_PPH}pph"
    _bl_mcc=${BL_MESH_CC:+-mesh-$BL_MESH_CC}
    case $1 in
        a) echo "loopback$_bl_mcc" ;;
        b) echo "netns$_bl_tail$_bl_mcc" ;;
        c) echo "netns-$BL_RATE$_bl_tail$_bl_mcc" ;;
        *) return 1 ;;
    esac
}

# bl_cc_check SETTINGS (comma-separated): with $BL_MESH_CC set, die unless
# this kernel has it; with $BL_CC set, die unless
# every setting is a namespace one and this kernel lets a new namespace
# default to $BL_CC. The machine's own settings are left alone: the
# message says what to change.
bl_cc_check() {
    [ -z "$BL_MESH_CC" ] || _bl_cc_available --mesh-cc "$BL_MESH_CC"
    [ -n "$BL_CC" ] || return 0
    case ",$1," in *,a,*)
        bl_die "--cc $BL_CC: only settings b and c (namespaces) can use" \
               "another congestion control; loopback runs in this" \
               "machine's own namespace, whose default stays as it is" ;;
    esac
    _bl_cc_available --cc "$BL_CC"
    _bl_f=/proc/sys/net/ipv4/tcp_allowed_congestion_control
    _bl_cc_listed $_bl_f "$BL_CC" ||
        bl_die "--cc $BL_CC: a namespace may only default to the allowed" \
               "ones ($_bl_f: $(cat $_bl_f 2>/dev/null)); allow it with" \
               "sysctl -w net.ipv4.tcp_allowed_congestion_control=\"$(cat \
               $_bl_f 2>/dev/null) $BL_CC\""
}

# _bl_cc_available FLAG CC: die, naming FLAG, unless this kernel has CC.
_bl_cc_available() {
    _bl_f=/proc/sys/net/ipv4/tcp_available_congestion_control
    _bl_cc_listed $_bl_f "$2" ||
        bl_die "$1 $2: this kernel has no such congestion control" \
               "($_bl_f: $(cat $_bl_f 2>/dev/null)); try 'modprobe tcp_$2'"
}

# _bl_cc_listed FILE CC: CC is one of the words in FILE.
_bl_cc_listed() {
    case " $(cat "$1" 2>/dev/null) " in *" $2 "*) return 0 ;; esac
    return 1
}

# bl_opt LIST ARGS...: ARGS' first argument, when it is one of the options
# the bench scripts share and LIST (e.g. "--time --prefix") names it:
# --prefix, --rate, --mtu, --cc and --mesh-cc set $BL_PREFIX, $BL_RATE,
# $BL_MTU, $BL_CC and $BL_MESH_CC; --time, --repeat, --out and --builddir
# set the caller's secs, repeat, outdir and builddir; --insecure sets its
# insecure to 1. Sets BL_SHIFT to the number of arguments used; returns 1
# (BL_SHIFT 0) for any other argument.
# shellcheck disable=SC2034 # secs, repeat, ...: the caller's variables
bl_opt() {
    BL_SHIFT=0
    case " $1 " in *" $2 "*) ;; *) return 1 ;; esac
    BL_SHIFT=2
    case $2 in
        --prefix) BL_PREFIX=$3 ;;
        --rate) BL_RATE=$3 ;;
        --mtu) BL_MTU=$3 ;;
        --cc) BL_CC=$3 ;;
        --mesh-cc) BL_MESH_CC=$3 ;;
        --peers-per-host) BL_PPH=$3 ;;
        --time) secs=$3 ;;
        --repeat) repeat=$3 ;;
        --out) outdir=$3 ;;
        --builddir) builddir=$3 ;;
        --insecure) insecure=1; BL_SHIFT=1 ;;
        *) BL_SHIFT=0; return 1 ;;
    esac
}

# bl_help: print the script's header comment (its --help).
bl_help() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; }

# bl_meshbench_has BIN OP INSTEAD: whether BIN is a built meshbench that
# has --op OP; when not, logs why and INSTEAD, what the script does then.
bl_meshbench_has() {
    if [ ! -x "$1" ]; then
        bl_log "meshbench not built at $1 (make, or --builddir):" "$3"
        return 1
    fi
    "$1" --help 2>&1 | grep -q "$2" && return 0
    bl_log "$1 has no --op $2: $3"
    return 1
}

# bl_hostfile FILE N: a hostfile of hosts 1 to N of a namespace setting (b,
# c), one slot each.
bl_hostfile() {
    : >"$1"
    _bl_i=1
    while [ $_bl_i -le $(($2 / BL_PPH)) ]; do
        echo "10.77.0.$_bl_i slots=$BL_PPH" >>"$1"
        _bl_i=$((_bl_i + 1))
    done
}

# bl_setup SETTING N: make the hosts (and remember them for bl_teardown);
# with $BL_CC, each host's namespace defaults to that congestion control.
bl_setup() {
    BL_SETTING=$1 BL_NP=$2
    [ "$1" = a ] || set -- "$1" $(($2 / BL_PPH))
    case $1 in
        a) return 0 ;;
        b) BL_UP=1
           "$BL_NETNS" up "$2" --prefix "$BL_PREFIX" \
               ${BL_MTU:+--mtu "$BL_MTU"} >/dev/null ;;
        c) BL_UP=1
           "$BL_NETNS" up "$2" --prefix "$BL_PREFIX" --rate "$BL_RATE" \
               ${BL_MTU:+--mtu "$BL_MTU"} >/dev/null ;;
        *) bl_die "unknown setting '$1' (a, b or c)" ;;
    esac || return 1
    [ -n "$BL_CC" ] || return 0
    _bl_i=1
    while [ $_bl_i -le "$2" ]; do
        ip netns exec "$BL_PREFIX$_bl_i" sysctl -q -w \
            net.ipv4.tcp_congestion_control="$BL_CC" ||
            bl_die "host $_bl_i: cannot default to congestion control $BL_CC"
        _bl_i=$((_bl_i + 1))
    done
}

# Stop what bl_bg started; remove the namespaces if bl_setup made them.
bl_teardown() {
    bl_kill_bg
    [ "$BL_UP" -eq 1 ] || return 0
    "$BL_NETNS" down --prefix "$BL_PREFIX" >/dev/null 2>&1 || true
    BL_UP=0
}

bl_addr() {
    case $BL_SETTING in
        a) echo 127.0.0.1 ;;
        *) echo "10.77.0.$1" ;;
    esac
}

bl_ifname() {
    case $BL_SETTING in
        a) echo lo ;;
        *) echo eth0 ;;
    esac
}

# bl_exec I CMD...: run CMD on host I.
bl_exec() {
    _bl_i=$1
    shift
    case $BL_SETTING in
        a) "$@" ;;
        *) ip netns exec "$BL_PREFIX$_bl_i" "$@" ;;
    esac
}

# bl_bg I CMD...: run CMD on host I in the background, remembering its pid
# (ip netns exec execs CMD, so the pid is CMD's own).
bl_bg() {
    _bl_i=$(( ($1 - 1) / BL_PPH + 1 ))
    shift
    case $BL_SETTING in
        a) "$@" & ;;
        *) ip netns exec "$BL_PREFIX$_bl_i" "$@" & ;;
    esac
    BL_PIDS="$BL_PIDS $!"
}

# Stop what bl_bg started and that is still running, by pid.
bl_kill_bg() {
    [ -n "$BL_PIDS" ] || return 0
    for _bl_p in $BL_PIDS; do
        kill -TERM "$_bl_p" 2>/dev/null
    done
    sleep 0.2
    for _bl_p in $BL_PIDS; do
        kill -KILL "$_bl_p" 2>/dev/null
    done
    for _bl_p in $BL_PIDS; do
        wait "$_bl_p" 2>/dev/null
    done
    BL_PIDS=
}

# bl_wait_bg SECONDS: wait for the background jobs, killing them after
# SECONDS. Returns non-zero if any failed or had to be killed.
bl_wait_bg() {
    _bl_limit=$1
    _bl_rc=0
    _bl_t=0
    while [ "$_bl_t" -lt $((_bl_limit * 10)) ]; do
        _bl_alive=0
        for _bl_p in $BL_PIDS; do
            kill -0 "$_bl_p" 2>/dev/null && _bl_alive=1
        done
        [ $_bl_alive -eq 0 ] && break
        sleep 0.1
        _bl_t=$((_bl_t + 1))
    done
    for _bl_p in $BL_PIDS; do
        if kill -0 "$_bl_p" 2>/dev/null; then
            bl_log "pid $_bl_p still running after ${_bl_limit}s: killing it"
            kill -KILL "$_bl_p" 2>/dev/null
            _bl_rc=1
        fi
        wait "$_bl_p" || _bl_rc=1
    done
    BL_PIDS=
    return $_bl_rc
}

# The machine's CPU use while something runs, from /proc/stat's "cpu"
# line (all cores), sampled every half second:
#   bl_cpu_start FILE   start sampling into FILE
#   bl_cpu_stop FILE    stop; print "busy user steal steal_max" in percent:
#                       busy and user are the medians over the samples of
#                       the share of the time the hypervisor left this
#                       machine (busy: not idle; user: user space, the
#                       rest is the kernel: system calls, TCP, softirqs);
#                       steal is the share of the whole run that the
#                       hypervisor gave to others, steal_max its worst
#                       half second. "nan nan nan nan" without /proc/stat.
# Busy near 100 means the run was bound by the CPU (on one machine, the
# settings here: all hosts share it); steal above a few percent means the
# numbers were disturbed from outside and deserve a rerun.
bl_cpu_start() {
    : >"$1"
    if [ -r /proc/stat ]; then
        (while :; do
             head -n 1 /proc/stat
             sleep 0.5
         done) >>"$1" 2>/dev/null &
        _bl_cpu_pid=$!
    else
        _bl_cpu_pid=
    fi
}

# bl_cpu_abort: stop the sampler, if any, without a report (cleanup traps).
bl_cpu_abort() {
    [ -n "${_bl_cpu_pid:-}" ] || return 0
    kill "$_bl_cpu_pid" 2>/dev/null
    wait "$_bl_cpu_pid" 2>/dev/null
    _bl_cpu_pid=
}

bl_cpu_stop() {
    if [ -n "${_bl_cpu_pid:-}" ]; then
        bl_cpu_abort
        head -n 1 /proc/stat >>"$1" 2>/dev/null
    fi
    awk '
        function median(a, n,    i, j, t) {
            for (i = 2; i <= n; i++)
                for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
                    t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
                }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        $1 == "cpu" && NF >= 9 {
            u = $2 + $3; idle = $5 + $6; st = $9; tot = 0
            for (k = 2; k <= 9; k++) tot += $k
            if (n++) {
                dt = tot - ptot; own = dt - (st - pst)
                if (dt > 0 && own > 0) {
                    m++
                    busy[m] = 100 * (own - (idle - pidle)) / own
                    user[m] = 100 * (u - pu) / own
                    s = 100 * (st - pst) / dt
                    if (s > smax) smax = s
                }
            } else {
                t0 = tot; s0 = st
            }
            pu = u; pidle = idle; pst = st; ptot = tot
        }
        END {
            if (!m || ptot <= t0) { print "nan nan nan nan"; exit }
            printf "%.0f %.0f %.1f %.1f\n", median(busy, m),
                   median(user, m), 100 * (pst - s0) / (ptot - t0), smax
        }' "$1"
}

# Size strings (4K, 64M, 1G, 4096) to bytes.
bl_bytes() {
    awk -v s="$1" 'BEGIN {
        m = 1; u = substr(s, length(s), 1);
        if (u ~ /[kK]/) m = 1024; else if (u ~ /[mM]/) m = 1048576;
        else if (u ~ /[gG]/) m = 1073741824;
        if (m > 1) s = substr(s, 1, length(s) - 1);
        if (s !~ /^[0-9]+$/) { print "bad"; exit 1 }
        printf "%d\n", s * m }'
}

# bl_parse_table SYSTEM SETTING NP: read an nccl-tests style table on
# stdin, print CSV rows "setting,np,system,size,time_us,algbw,busbw,wrong".
# The columns are found by name in the "#  size ... time algbw busbw"
# header (its first time/algbw/busbw, i.e. out-of-place; wrong sums every
# #wrong column, out-of-place and in-place), so meshbench,
# mpi_allreduce and gloo_allreduce all parse the same way.
bl_parse_table() {
    awk -v sys="$1" -v set="$2" -v np="$3" '
        /^#/ && /size/ && /busbw/ && !hdr {
            line = $0; sub(/^#/, "", line);
            nf = split(line, h, " ");
            for (k = 1; k <= nf; k++) {
                if (h[k] == "size" && !cs) cs = k;
                if (h[k] == "time" && !ct) ct = k;
                if (h[k] == "algbw" && !ca) ca = k;
                if (h[k] == "busbw" && !cb) cb = k;
                if (h[k] == "#wrong") cw[++nw] = k;
            }
            hdr = 1; next
        }
        /^#/ || NF == 0 { next }
        hdr && $cs ~ /^[0-9]+$/ {
            w = "";
            for (k = 1; k <= nw; k++)
                w = (w == "" ? 0 : w) + ($cw[k] ~ /^[0-9]+$/ ? $cw[k] : 0);
            printf "%s,%s,%s,%s,%s,%s,%s,%s\n", set, np, sys, $cs, $ct,
                   $ca, $cb, w
        }'
}
