#!/bin/sh
# tests/verbs/guest-lib.sh: network and Soft-RoCE setup inside the guest
# (sourced by the job scripts that tests/verbs/*.sh boot).
#
#   guest_one_host   lo up; mtd0 10.77.0.1/24; rxe0 over it
#   guest_two_hosts  namespaces h1, h2 joined by a veth pair (10.78.0.1/2),
#                    rxe1 over h1's end, rxe2 over h2's end
#   guest_gid DEV    index of DEV's first RoCE v2 IPv4 GID

guest_one_host() {
    ip link set lo up &&
        ip link add mtd0 type dummy &&
        ip addr add 10.77.0.1/24 dev mtd0 &&
        ip link set mtd0 up &&
        rdma link add rxe0 type rxe netdev mtd0
}

guest_two_hosts() {
    ip netns add h1 && ip netns add h2 &&
        ip link add v1 type veth peer name v2 &&
        ip link set v1 netns h1 && ip link set v2 netns h2 &&
        ip -n h1 addr add 10.78.0.1/24 dev v1 &&
        ip -n h2 addr add 10.78.0.2/24 dev v2 &&
        ip -n h1 link set v1 up && ip -n h2 link set v2 up &&
        ip -n h1 link set lo up && ip -n h2 link set lo up &&
        ip netns exec h1 rdma link add rxe1 type rxe netdev v1 &&
        ip netns exec h2 rdma link add rxe2 type rxe netdev v2
}

guest_gid() {
    d=/sys/class/infiniband/$1/ports/1
    for f in "$d"/gid_attrs/types/*; do
        i=${f##*/}
        t=$(cat "$f" 2>/dev/null) || continue
        g=$(cat "$d/gids/$i")
        case "$t:$g" in
        "RoCE v2:0000:0000:0000:0000:0000:ffff:"*) echo "$i"; return 0 ;;
        esac
    done
    return 1
}
