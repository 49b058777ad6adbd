# tests/mesh_lib.sh: shared pieces of the mesh scenario scripts (sourced).
# TAP output, free ports, background processes that are always cleaned up.
#
# Sets: MESHRUN, MESHBENCH, TMP (a private directory, removed on exit).
# Every process started with bg() is killed (by pid) on exit.

top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
top_builddir=${top_builddir:-$top_srcdir}
MESHRUN=$top_builddir/meshrun
MESHBENCH=$top_builddir/meshbench
# Keep the logs readable: one line per event at info level.
export MESHTRAIN_LOG=${MESHTRAIN_LOG:-info}
unset MESHTRAIN_HOSTFILE MESHTRAIN_HOSTS MESHTRAIN_RANK MESHTRAIN_SIZE \
      MESHTRAIN_SECRET_FILE MESHTRAIN_SECRET_FD MESHTRAIN_INSECURE \
      MESHTRAIN_PORT MESHTRAIN_JOB_ID MESHTRAIN_TCP_CONGESTION \
      SLURM_PROCID SLURM_NTASKS \
      OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE

TMP=$(mktemp -d "${TMPDIR:-/tmp}/meshtest.XXXXXX") || exit 99
T_N=0
T_FAILED=0
T_PIDS=""
T_CLEANUP_HOOK=""

t_cleanup() {
    for p in $T_PIDS; do
        kill -CONT "$p" 2>/dev/null
        kill -TERM "$p" 2>/dev/null
    done
    for p in $T_PIDS; do
        i=0
        while kill -0 "$p" 2>/dev/null && [ $i -lt 20 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        kill -KILL "$p" 2>/dev/null
    done
    [ -n "$T_CLEANUP_HOOK" ] && $T_CLEANUP_HOOK
    [ -n "$T_KEEP" ] || rm -rf "$TMP" # T_KEEP=1: keep the logs to look at
}
trap 't_cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# cc_lists: CC_AVAIL and CC_ALLOWED, the kernel's lists of TCP congestion
# controls, and CC_BANNED, the first one available but not allowed to
# unprivileged processes and new namespaces ("" when there is none).
cc_lists() {
    CC_AVAIL=$(cat /proc/sys/net/ipv4/tcp_available_congestion_control \
               2>/dev/null)
    CC_ALLOWED=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control \
                 2>/dev/null)
    CC_BANNED=
    for _c in $CC_AVAIL; do
        case " $CC_ALLOWED " in *" $_c "*) ;; *) CC_BANNED=$_c; break ;; esac
    done
}

t_plan() { echo "1..$1"; }
t_ok() { # t_ok COND-STATUS NAME
    T_N=$((T_N + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $T_N - $2"
    else
        echo "not ok $T_N - $2"
        T_FAILED=$((T_FAILED + 1))
    fi
}
t_skip() { T_N=$((T_N + 1)); echo "ok $T_N # SKIP $1"; }
t_diag() { echo "# $*"; }
t_skip_all() { echo "1..0 # SKIP $1"; exit 0; }
t_done() { [ "$T_FAILED" -eq 0 ]; exit $?; }

# Show a file's lines as TAP diagnostics (for failures).
t_show() {
    [ -f "$1" ] && sed 's/^/#   /' "$1" | tail -n "${2:-30}"
}

# t_netns_up LETTER N [OPTIONS...]: N hosts in network namespaces
# (scripts/netns.sh up N OPTIONS, addresses 10.77.0.1-N) under the prefix
# PREFIX=LETTER<pid mod 1000000> (netns.sh takes 8 characters at most:
# LETTER is 1 or 2; two scripts of one LETTER whose pids agreed mod 1000
# took each other's hosts down). Skips the whole script, with the
# reason, without root, iproute2 or namespace support; bails out where
# setting them up fails. They are taken down on exit, after the command
# in T_NETNS_DOWN_FIRST, if set (for what the script added to them).
t_netns_up() { t_netns_try "$@" || t_skip_all "$NETNS_WHY"; }
# t_netns_try LETTER N [OPTIONS...]: t_netns_up for a script that needs
# them in some rows only: without root, iproute2 or namespace support it
# returns 1 with the reason in NETNS_WHY (the caller skips those rows);
# where setting them up fails it bails out all the same.
t_netns_try() {
    NETNS=$top_srcdir/scripts/netns.sh
    NETNS_WHY="scripts/netns.sh is missing"
    [ -f "$NETNS" ] || return 1
    PREFIX=$1$(( $$ % 1000000 ))
    shift
    NETNS_WHY=$(sh "$NETNS" check --prefix "$PREFIX" 2>&1) || {
        NETNS_WHY="network namespaces unavailable: $NETNS_WHY"
        return 1
    }
    T_CLEANUP_HOOK=t_netns_down
    sh "$NETNS" up "$@" --prefix "$PREFIX" > "$TMP/up.log" 2>&1 || {
        t_show "$TMP/up.log"
        echo "Bail out! scripts/netns.sh up $* failed"
        exit 1
    }
}
# t_netns_agent FILE: FILE becomes the "remote shell" of meshrun's ssh
# launcher (--launcher ssh --ssh FILE) for those hosts: FILE HOST COMMAND
# runs COMMAND in the namespace of HOST (10.77.0.K).
t_netns_agent() {
    # shellcheck disable=SC2016
    printf '#!/bin/sh\nhost=$1\nshift\nexec ip netns exec "%s${host##*.}" sh -c "$1"\n' \
        "$PREFIX" > "$1"
    chmod +x "$1"
}
t_netns_down() {
    [ -n "${T_NETNS_DOWN_FIRST:-}" ] && $T_NETNS_DOWN_FIRST
    sh "$NETNS" down --prefix "$PREFIX" > /dev/null 2>&1
}

# take_ports N: sets PORT and keeps those ports ours (tests/ports.sh).
. "$top_srcdir/tests/ports.sh"

# bg CMD...: start CMD in the background, remember its pid in $BG_PID.
bg() {
    "$@" &
    BG_PID=$!
    T_PIDS="$T_PIDS $BG_PID"
}

# wait_exit PID SECONDS: wait for PID to end; sets $EXIT_CODE (or 255 when
# it was still running after SECONDS, then it is killed) and $EXIT_AFTER.
wait_exit() {
    _start=$(date +%s)
    _limit=$(( $2 * 10 ))
    _i=0
    while kill -0 "$1" 2>/dev/null && [ $_i -lt $_limit ]; do
        sleep 0.1
        _i=$((_i + 1))
    done
    EXIT_AFTER=$(( $(date +%s) - _start ))
    if kill -0 "$1" 2>/dev/null; then
        kill -CONT "$1" 2>/dev/null
        kill -KILL "$1" 2>/dev/null
        wait "$1" 2>/dev/null
        EXIT_CODE=255
        return
    fi
    wait "$1"
    EXIT_CODE=$?
}

# wait_for FILE PATTERN SECONDS: until FILE contains PATTERN (grep -E).
wait_for() {
    _i=0
    while [ $_i -lt $(( $3 * 10 )) ]; do
        grep -Eq "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
        _i=$((_i + 1))
    done
    return 1
}

# all_pairs_ok LOG N SIZES WHO: the tests of a meshbench --all-pairs --op
# all run of N ranks over SIZES sizes, whose table rank 0 printed in LOG:
# a row per op (ping-pong, stream), round and size, none with errors (the
# last column) and no "wrong data" on any rank. WHO starts the names.
all_pairs_ok() {
    _rounds=$(( $2 % 2 ? $2 : $2 - 1 ))
    _want=$(( 2 * _rounds * $3 ))
    _rows=$(grep -Ec '^\[0\] +(pingpong|stream) ' "$1")
    t_ok "$([ "$_rows" -eq "$_want" ]; echo $?)" \
        "$4: $_rows table rows (want $_want)"
    _bad=$(grep -E '^\[0\] +(pingpong|stream) ' "$1" |
           awk '$NF != 0 { n++ } END { print n + 0 }')
    t_ok "$([ "$_bad" -eq 0 ] && ! grep -q 'wrong data' "$1"; echo $?)" \
        "$4: no wrong byte on any rank ($_bad rows with errors)"
}

# A 0600 secret file shared by peers started by hand.
make_secret() {
    head -c 32 /dev/urandom | base64 > "$1"
    chmod 600 "$1"
}

# The pid of rank R among meshrun's children (from their environment).
rank_pid() {
    for c in $(ps -o pid= --ppid "$1"); do
        if tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null |
           grep -qx "MESHTRAIN_RANK=$2"; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

[ -x "$MESHRUN" ] && [ -x "$MESHBENCH" ] ||
    t_skip_all "meshrun or meshbench not built in $top_builddir"
