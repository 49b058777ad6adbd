#!/bin/sh
# netns.sh: N "hosts" as Linux network namespaces on one bridge, for the
# tests and benchmarks. This is meshtrain's own private test network: it
# only ever uses 10.77.0.0/24 inside its own namespaces.
#
#   scripts/netns.sh up N [--prefix P] [--rate R] [--burst B] [--latency L]
#                         [--mtu M]
#       Creates namespaces P1..PN (default prefix "mt"). Host i has the
#       interface "eth0" with address 10.77.0.i/24 (and "lo" up), the other
#       end of its veth pair is "Pv<i>" in the root namespace, enslaved to
#       bridge "Pbr0". The bridge itself has no address, so several
#       prefixes can run side by side without seeing each other.
#       --rate R (tc syntax, e.g. 1gbit) shapes each host's egress with
#       tbf on its eth0 (burst defaults to max(64kb, R/250), latency to
#       20ms). --mtu M sets the MTU of every veth end and the bridge
#       (default: the kernel's, 1500; e.g. 9000 for jumbo frames). Any
#       earlier network of the same prefix is removed first, so
#       "up" is idempotent. Prints one line per host: "P<i> 10.77.0.i".
#   scripts/netns.sh down [--prefix P]
#       Kills what still runs inside P<i> (by pid: SIGTERM, then SIGKILL),
#       removes the namespaces, veths and bridge. Removing nothing is not
#       an error; safe to call twice and from a trap. Only this prefix's
#       hosts are touched (those with a veth Pv<i>, or recorded by "up" in
#       /run/meshtrain-netns/P), so prefixes like mm1234 and mm12345 can run
#       side by side. Concurrent runs must use different prefixes: "up"
#       first removes whatever network the same prefix had.
#   scripts/netns.sh check [--prefix P]
#       Exit 0 if namespaces and a bridge can be created here (it tries);
#       otherwise prints why on stdout and exits 77 (Automake's "skip").
#   scripts/netns.sh exec I CMD...  [--prefix P must come before I]
#       Runs CMD inside host I (ip netns exec P<I> CMD...).
#   scripts/netns.sh addr I   prints 10.77.0.I.
#
# The prefix may be at most 8 characters ([a-z0-9]) so that interface
# names fit IFNAMSIZ. Environment: MT_NETNS_PREFIX sets the default prefix.
# Hosts are limited to 1..200.
# Exit codes: 0 success, 1 failure (message on stderr), 2 usage error,
# 77 namespaces unavailable (check, up).

set -u

SUBNET=10.77.0
prefix=${MT_NETNS_PREFIX:-mt}

die() { echo "netns.sh: $*" >&2; exit 1; }
usage() {
    echo "usage: netns.sh up N [--prefix P] [--rate R] [--burst B]" \
         "[--latency L] [--mtu M] | down [--prefix P] | check [--prefix P] |" \
         "exec [--prefix P] I CMD... | addr I" >&2
    exit 2
}

check_prefix() {
    case $prefix in
        ''|*[!a-z0-9]*) echo "netns.sh: bad prefix '$prefix' ([a-z0-9]+)" >&2
                        exit 2 ;;
    esac
    [ ${#prefix} -le 8 ] || { echo "netns.sh: prefix '$prefix' longer" \
                              "than 8 characters" >&2; exit 2; }
}

# Why namespaces cannot be used here, or nothing (and status 0) if they can.
cant() {
    [ "$(id -u)" -eq 0 ] || { echo "not root"; return 1; }
    command -v ip >/dev/null 2>&1 || { echo "ip (iproute2) not found"
                                       return 1; }
    probe="${prefix}chk$$"
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "cannot create a network namespace: $err"
        return 1
    fi
    ip netns del "$probe" 2>/dev/null
    # Interface names must fit IFNAMSIZ (15): short ones, unique by pid.
    if ! err=$(ip link add "mtcb$$" type bridge 2>&1); then
        echo "cannot create a bridge: $err"
        return 1
    fi
    ip link del "mtcb$$" 2>/dev/null
    if ! err=$(ip link add "mtca$$" type veth peer name "mtcz$$" 2>&1); then
        echo "cannot create a veth pair: $err"
        return 1
    fi
    ip link del "mtca$$" 2>/dev/null
    return 0
}

# "up" records how many hosts it made here, so that "down" finds them
# even when their veths are already gone.
state_dir() {
    if [ -d /run ] && [ -w /run ]; then
        echo /run/meshtrain-netns
    else
        echo "${TMPDIR:-/tmp}/meshtrain-netns"
    fi
}

# Namespaces of this prefix: P<i> whose root-side veth P"v"<i> exists, or
# that the state file lists. Matching names alone is not enough: with
# prefixes mm1234 and mm12345 running side by side, mm123451 is host 1 of
# the second, not host 51 of the first.
list_ns() {
    _max=$(cat "$(state_dir)/$prefix" 2>/dev/null)
    case $_max in ''|*[!0-9]*) _max=0 ;; esac
    for _ns in $(ip netns list 2>/dev/null | awk '{print $1}' |
                 grep -E "^${prefix}[0-9]+\$"); do
        _i=${_ns#"$prefix"}
        if ip link show "${prefix}v$_i" >/dev/null 2>&1 ||
           { [ "$_i" -ge 1 ] && [ "$_i" -le "$_max" ] &&
             [ "$_i" = "$(echo "$_i" | sed 's/^0*//')" ]; }; then
            echo "$_ns"
        fi
    done
}

do_down() {
    nss=$(list_ns)
    for ns in $nss; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -TERM $pids 2>/dev/null
    done
    for ns in $nss; do
        i=0
        while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ $i -lt 20 ]
        do
            sleep 0.1
            i=$((i + 1))
        done
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    # Host-side veth ends vanish with their peers; sweep any stragglers
    # still on this prefix's bridge.
    for l in $(ip -o link show master "${prefix}br0" 2>/dev/null |
               awk -F': ' '{sub(/@.*/, "", $2); print $2}' |
               grep -E "^${prefix}v[0-9]+\$"); do
        ip link del "$l" 2>/dev/null
    done
    if ip link show "${prefix}br0" >/dev/null 2>&1; then
        ip link del "${prefix}br0" 2>/dev/null ||
            die "cannot remove bridge ${prefix}br0"
    fi
    rm -f "$(state_dir)/$prefix"
    return 0
}

# tc size for tbf's burst: rate/250 bytes (one 4 ms tick), at least 64 KiB
# so that a full GSO segment always fits.
default_burst() {
    r=$1
    num=$(echo "$r" | sed 's/[^0-9.].*//')
    unit=$(echo "$r" | sed 's/^[0-9.]*//' | tr 'A-Z' 'a-z')
    case $unit in
        bit) mul=1 ;; kbit) mul=1000 ;; mbit) mul=1000000 ;;
        gbit) mul=1000000000 ;; tbit) mul=1000000000000 ;;
        bps) mul=8 ;; kbps) mul=8000 ;; mbps) mul=8000000 ;;
        gbps) mul=8000000000 ;;
        *) die "cannot parse rate '$r' (use e.g. 1gbit, 500mbit)" ;;
    esac
    awk -v n="$num" -v m="$mul" 'BEGIN {
        b = n * m / 8 / 250; if (b < 65536) b = 65536;
        printf "%d\n", b }'
}

# A failed "up" removes what it made before it reports.
up_fail() {
    do_down
    die "$@"
}

do_up() {
    n=$1 rate=$2 burst=$3 latency=$4 mtu=$5
    if [ -n "$rate" ] && [ -z "$burst" ]; then
        burst=$(default_burst "$rate") || exit 2
    fi
    why=$(cant) || { echo "netns.sh: $why" >&2; exit 77; }
    do_down
    mkdir -p "$(state_dir)" && echo "$n" >"$(state_dir)/$prefix" ||
        die "cannot write $(state_dir)/$prefix"
    ip link add "${prefix}br0" type bridge || up_fail "cannot create bridge"
    if [ -n "$mtu" ]; then
        ip link set "${prefix}br0" mtu "$mtu" ||
            up_fail "cannot set the MTU of ${prefix}br0 to $mtu"
    fi
    ip link set "${prefix}br0" up || up_fail "cannot bring up ${prefix}br0"
    i=1
    while [ "$i" -le "$n" ]; do
        ns="${prefix}$i"
        ip netns add "$ns" || up_fail "cannot create namespace $ns"
        ip link add "${prefix}v$i" type veth peer name eth0 netns "$ns" ||
            up_fail "cannot create veth ${prefix}v$i"
        if [ -n "$mtu" ]; then
            ip link set "${prefix}v$i" mtu "$mtu" &&
                ip -n "$ns" link set eth0 mtu "$mtu" ||
                up_fail "cannot set the MTU of host $i's veth to $mtu"
        fi
        ip link set "${prefix}v$i" master "${prefix}br0" ||
            up_fail "cannot attach ${prefix}v$i to ${prefix}br0"
        ip link set "${prefix}v$i" up || up_fail "cannot bring up ${prefix}v$i"
        ip -n "$ns" link set lo up || up_fail "cannot bring up lo in $ns"
        ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0 ||
            up_fail "cannot address eth0 in $ns"
        ip -n "$ns" link set eth0 up || up_fail "cannot bring up eth0 in $ns"
        if [ -n "$rate" ]; then
            ip netns exec "$ns" tc qdisc replace dev eth0 root tbf \
                rate "$rate" burst "$burst" latency "$latency" ||
                up_fail "cannot shape eth0 in $ns to $rate"
        fi
        echo "$ns $SUBNET.$i"
        i=$((i + 1))
    done
    # Wait until every host's address is usable (DAD does not apply to
    # IPv4, but the bridge ports take a moment to forward).
    i=0
    while [ $i -lt 50 ]; do
        state=$(ip -o link show master "${prefix}br0" 2>/dev/null |
                grep -c 'state UP' || true)
        [ "$state" -ge "$n" ] && break
        sleep 0.1
        i=$((i + 1))
    done
    return 0
}

[ $# -ge 1 ] || usage
cmd=$1
shift
n=
rate=
burst=
latency=20ms
mtu=
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
        --rate=*) rate=${1#--rate=}; shift ;;
        --burst) [ $# -ge 2 ] || usage; burst=$2; shift 2 ;;
        --burst=*) burst=${1#--burst=}; shift ;;
        --latency) [ $# -ge 2 ] || usage; latency=$2; shift 2 ;;
        --latency=*) latency=${1#--latency=}; shift ;;
        --mtu) [ $# -ge 2 ] || usage; mtu=$2; shift 2 ;;
        --mtu=*) mtu=${1#--mtu=}; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *)
            if [ -z "$n" ]; then
                n=$1
                shift
                [ "$cmd" = exec ] && break
            else
                usage
            fi
            ;;
    esac
done
check_prefix

case $cmd in
    up)
        case $n in ''|*[!0-9]*) usage ;; esac
        [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
            { echo "netns.sh: N must be 1..200, not $n" >&2; exit 2; }
        case $mtu in
            '') ;;
            *[!0-9]*) echo "netns.sh: --mtu '$mtu': expected 68..65535" >&2
                      exit 2 ;;
            *) [ "$mtu" -ge 68 ] && [ "$mtu" -le 65535 ] ||
                   { echo "netns.sh: --mtu '$mtu': expected 68..65535" >&2
                     exit 2; } ;;
        esac
        do_up "$n" "$rate" "$burst" "$latency" "$mtu"
        ;;
    down)
        [ -z "$n" ] || usage
        do_down
        ;;
    check)
        [ -z "$n" ] || usage
        why=$(cant) || { echo "netns.sh: $why"; exit 77; }
        ;;
    exec)
        case $n in ''|*[!0-9]*) usage ;; esac
        [ $# -ge 1 ] || usage
        exec ip netns exec "${prefix}$n" "$@"
        ;;
    addr)
        case $n in ''|*[!0-9]*) usage ;; esac
        echo "$SUBNET.$n"
        ;;
    -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" ;;
    *) usage ;;
esac
