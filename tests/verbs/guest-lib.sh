#!/bin/sh
# tests/verbs/guest-lib.sh: network and Soft-RoCE setup inside the guest
# (sourced by the job scripts that tests/verbs/*.sh boot).
#
#   guest_one_host   lo up; mtd0 10.77.0.1/24; rxe0 over it
#   guest_gid DEV    index of DEV's first RoCE v2 IPv4 GID

guest_one_host() {
    ip link set lo up &&
        ip link add mtd0 type dummy &&
        ip addr add 10.77.0.1/24 dev mtd0 &&
        ip link set mtd0 up &&
        rdma link add rxe0 type rxe netdev mtd0
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
