#!/bin/sh
# tests/bench_cc.sh: the bench scripts' --cc CC (bench/lib.sh's BL_CC):
# every namespace host defaults to TCP congestion control CC, so that all
# the systems compared run under it. A CC the kernel lacks or does not
# allow in new namespaces, and the loopback setting (this machine's own
# namespace, left alone), are refused before anything starts, naming what
# and why. The namespace part skips, with the reason, without namespaces.
# --mesh-cc CC (BL_MESH_CC): meshbench and iperf3 choose CC for their own
# sockets, on loopback too; a CC the kernel lacks is refused the same way.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 8
B=$top_srcdir/bench

out=$(sh "$B/collectives.sh" --settings a,b --cc reno --out "$TMP/out" 2>&1)
rc=$?
t_ok $([ $rc -ne 0 ] && echo "$out" | grep -q "only settings b and c" &&
       [ ! -e "$TMP/out" ]; echo $?) \
    "--cc with the loopback setting: refused before anything ran (rc $rc)"

out=$(sh "$B/tcp_limit.sh" --setting b --np 2 --cc nosuchcc 2>&1)
rc=$?
t_ok $([ $rc -ne 0 ] && echo "$out" | grep -q "no such congestion control" &&
       echo "$out" | grep -q "tcp_available_congestion_control"; echo $?) \
    "an unknown congestion control names the kernel's list: $out"

out=$(sh "$B/collectives.sh" --settings a --mesh-cc nosuchcc \
      --out "$TMP/out" 2>&1)
rc=$?
t_ok $([ $rc -ne 0 ] && [ ! -e "$TMP/out" ] &&
       echo "$out" | grep -q "mesh-cc nosuchcc: this kernel has no such";
       echo $?) "--mesh-cc with an unknown one: refused before anything ran"

# --mesh-cc on loopback: iperf3's two ends report the one asked for (not
# the machine's default), and the setting's name says so.
def=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
mcc=reno
[ "$def" = reno ] && mcc=cubic
if ! command -v iperf3 >/dev/null; then
    t_skip "iperf3 not installed (apt-get install iperf3)"
    t_skip "iperf3 not installed (apt-get install iperf3)"
else
    sh "$B/tcp_limit.sh" --setting a --np 2 --time 1 --mesh-cc "$mcc" \
        >"$TMP/mcc.txt" 2>&1
    said=$(grep stream_cc "$TMP/mcc.txt" || echo nothing)
    t_ok $(grep -q "^stream_cc $mcc/$mcc\$" "$TMP/mcc.txt"; echo $?) \
        "tcp_limit.sh --mesh-cc $mcc (machine default $def): iperf3: $said"
    [ "$said" != nothing ] || t_show "$TMP/mcc.txt"
    name=$(BL_MESH_CC=$mcc sh -c ". '$B/lib.sh'; bl_setting_name a")
    t_ok $([ "$name" = "loopback-mesh-$mcc" ]; echo $?) \
        "the setting's name says so ($name)"
fi

# A CC the kernel has but does not allow in namespaces, if there is one.
cc_lists
avail=$CC_AVAIL allowed=$CC_ALLOWED banned=$CC_BANNED
if [ -z "$banned" ]; then
    t_skip "every available congestion control is allowed here ($avail)"
else
    out=$(sh "$B/tcp_limit.sh" --setting b --np 2 --cc "$banned" 2>&1)
    rc=$?
    t_ok $([ $rc -ne 0 ] && echo "$out" | grep -q "allow it with sysctl";
           echo $?) "a congestion control not allowed in namespaces ($banned)" \
        "says how to allow it"
fi

# The real thing: two namespace hosts under reno, which Linux always has
# and always allows, unless it is this machine's default already (then
# bbr or cubic, whichever is allowed and not the default).
NETNS=$top_srcdir/scripts/netns.sh
PREFIX=c$(( $$ % 1000 ))
why=$(sh "$NETNS" check --prefix "$PREFIX" 2>&1)
if [ $? -ne 0 ]; then
    t_skip "network namespaces unavailable: $why"
    t_skip "network namespaces unavailable: $why"
    t_done
fi
def=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
cc=
for c in reno bbr cubic; do
    [ "$c" != "$def" ] || continue
    case " $allowed " in *" $c "*) cc=$c; break ;; esac
done
if [ -z "$cc" ]; then
    t_skip "no congestion control but the default ($def) is allowed"
    t_skip "no congestion control but the default ($def) is allowed"
    t_done
fi
(
    BL_PREFIX=$PREFIX BL_CC=$cc
    . "$B/lib.sh"
    trap bl_teardown EXIT
    bl_setup b 2 || exit 1
    echo "name $(bl_setting_name b)"
    for i in 1 2; do
        echo "host$i $(bl_exec $i cat /proc/sys/net/ipv4/tcp_congestion_control)"
    done
) >"$TMP/cc.txt" 2>&1
t_ok $(grep -q "^name netns-$cc\$" "$TMP/cc.txt"; echo $?) \
    "the setting's name says its congestion control (netns-$cc)"
t_ok $([ "$(grep -c "^host[12] $cc\$" "$TMP/cc.txt")" -eq 2 ] &&
       [ "$(cat /proc/sys/net/ipv4/tcp_congestion_control)" = "$def" ];
       echo $?) \
    "both hosts default to $cc; this machine's default stays $def"
t_show "$TMP/cc.txt"
t_done
