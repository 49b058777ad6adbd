#!/bin/sh
# netns_rsh.sh: Open MPI's plm_rsh_agent for hosts that are network
# namespaces made by scripts/netns.sh. mpirun calls it as an ssh stand-in,
#   netns_rsh.sh [ssh-options...] HOST COMMAND...
# and it runs COMMAND with /bin/sh inside the namespace that HOST names:
# 10.77.0.I maps to ${MT_NETNS_PREFIX:-mt}I, and a namespace name is taken
# as it is. The environment (OMPI_ALLOW_RUN_AS_ROOT and the rest) passes
# through unchanged, unlike ssh.
#   mpirun --mca plm_rsh_agent bench/netns_rsh.sh \
#          --mca plm_rsh_no_tree_spawn 1 ...
prefix=${MT_NETNS_PREFIX:-mt}
while [ $# -gt 0 ]; do
    case $1 in
        -*) shift ;;
        *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "netns_rsh.sh: usage: netns_rsh.sh HOST COMMAND..." >&2
                  exit 255; }
host=$1
shift
case $host in
    10.77.0.*) ns="$prefix${host#10.77.0.}" ;;
    *) ns=$host ;;
esac
ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" ||
    { echo "netns_rsh.sh: no network namespace '$ns' for host '$host'" >&2
      exit 255; }
exec ip netns exec "$ns" /bin/sh -c "$*"
