#!/bin/sh
# tests/mesh_netns.sh: peers as separate hosts. scripts/netns.sh makes 4
# network namespaces (veth pairs on a bridge, addresses 10.77.0.1-4);
# meshrun starts one rank in each through its ssh launcher, with an agent
# that runs the command in the host's namespace instead of over ssh (so the
# secret goes over the "ssh" stdin path). meshbench --all-pairs checks every
# received byte over every link. Skips, with the reason, without root,
# iproute2 or namespace support.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_netns_up m 4

# The "remote shell": AGENT HOST COMMAND runs COMMAND in HOST's namespace.
t_netns_agent "$TMP/agent"

t_plan 6
for n in 2 4; do
    hf=$TMP/hosts$n
    : > "$hf"
    i=1
    while [ $i -le $n ]; do
        echo "10.77.0.$i slots=1" >> "$hf"
        i=$((i + 1))
    done
    log=$TMP/netns$n.log
    timeout 300 "$MESHRUN" --hostfile "$hf" --launcher ssh \
        --ssh "$TMP/agent" -- "$MESHBENCH" --join-timeout 30 --all-pairs \
        --op all -b 5 -e 5M -f 9 -n 2 -w 1 > "$log" 2>&1
    rc=$?
    t_ok $rc "$n hosts in namespaces: meshbench over every link exits 0 \
(got $rc)"
    [ $rc -eq 0 ] || t_show "$log"
    # 7 sizes: 5, 45, ..., 2657205
    all_pairs_ok "$log" "$n" 7 "$n hosts"
done
t_done
