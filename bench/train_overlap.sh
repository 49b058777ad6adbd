#!/bin/sh
# bench/train_overlap.sh: what data parallelism costs meshtrain here.
# Runs the same training job with 1, 2 and 4 peers on this machine
# (loopback; meshrun, one compute thread per peer) and prints, per peer
# count: the step time, its split into compute / exposed communication /
# data wait (from --metrics), the exposed communication as the seed
# benchmark defines it, t_step(N) - t_step(1), and from --timeline the
# all-reduce time per step and the fraction of it hidden behind backward.
# Run by hand from the build directory; not part of make check.
#   bench/train_overlap.sh [--netns] [--peers "1 2 4"] [--iters N]
#                          [-- MESHTRAIN-ARGS]
# --netns: each peer in its own network namespace ("host", scripts/netns.sh,
# root needed), connected by veth pairs on a bridge, instead of loopback.
# Default job: ResNet-50 on synthetic 32 x 32 images, batch 32 per peer
# (97.5 MiB of gradients per step, the seed's model).
# Caveat: on a 2-core machine, 4 peers also share the cores, so
# t_step(4) - t_step(1) includes compute slowed by sharing; the exposed
# communication column measures only the wait after backward.
set -u
. "$(dirname "$0")/lib.sh"
here=$bl_srcdir
builddir=${MESHTRAIN_BUILDDIR:-.}
[ -x "$builddir/meshtrain" ] || builddir=$here
peers="1 2 4"
iters=8
netns=0
while [ $# -gt 0 ]; do
    case $1 in
    --netns) netns=1; shift ;;
    --peers) peers=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [--peers LIST] [--iters N] [-- ARGS]" >&2; exit 1 ;;
    esac
done
job=${*:-"--model resnet50 --data synthetic:4096 --image-size 32 \
--num-classes 10 --batch 32"}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/train_overlap.XXXXXX") || exit 1
prefix=tro$$
prefix=$(printf '%s' "$prefix" | cut -c1-8)
cleanup() {
    [ $netns -eq 1 ] && sh "$here/scripts/netns.sh" down --prefix "$prefix"
    rm -rf "$tmp"
}
trap cleanup EXIT
where=loopback
[ $netns -eq 1 ] && where="network namespaces (veth + bridge)"
echo "# job: $job, $iters steps, $where, $(nproc) cores"
echo "peers,steps,t_step_s,t_compute_s,t_comm_exposed_s,t_data_s,img_per_s,allreduce_s_per_step,hidden_s_per_step,hidden_fraction"
base=""
for n in $peers; do
    port=$((29700 + n * 10))
    out="--iters $iters --no-eval --threads 1 --quiet \
--metrics $tmp/m$n.jsonl --timeline $tmp/t$n.json --timeline-steps $iters"
    if [ $netns -eq 1 ] && [ "$n" -gt 1 ]; then
        sh "$here/scripts/netns.sh" up "$n" --prefix "$prefix" > /dev/null ||
            { echo "# netns up failed"; exit 1; }
        bl_hostfile "$tmp/hosts" "$n"
        head -c 32 /dev/urandom | base64 > "$tmp/secret"
        chmod 600 "$tmp/secret"
        pids=""
        r=0
        while [ $r -lt "$n" ]; do
            # shellcheck disable=SC2086
            OMP_WAIT_POLICY=passive MESHTRAIN_LOG=warn \
            sh "$here/scripts/netns.sh" exec --prefix "$prefix" $((r + 1)) \
                "$builddir/meshtrain" --hostfile "$tmp/hosts" --rank $r \
                --port $port --secret-file "$tmp/secret" $job $out \
                > "$tmp/log$n.$r" 2>&1 &
            pids="$pids $!"
            r=$((r + 1))
        done
        bad=0
        for p in $pids; do wait "$p" || bad=1; done
        sh "$here/scripts/netns.sh" down --prefix "$prefix"
        [ $bad -eq 0 ] ||
            { echo "# $n peers failed:"; tail -n 5 "$tmp/log$n.0"; continue; }
    else
        # shellcheck disable=SC2086
        OMP_WAIT_POLICY=passive MESHTRAIN_LOG=warn \
        "$builddir/meshrun" -np "$n" -H "localhost:$n" -- \
            "$builddir/meshtrain" --port $port $job $out > "$tmp/log$n" 2>&1 ||
            { echo "# $n peers failed:"; tail -n 5 "$tmp/log$n"; continue; }
    fi
    row=$(/usr/bin/python3 "$here/bench/train_report.py" "$n" \
          "$tmp/m$n.jsonl" "$tmp/t$n.json")
    echo "$row"
    t=$(echo "$row" | cut -d, -f3)
    [ -z "$base" ] && base=$t
    echo "$n $t $base" >> "$tmp/steps"
done
echo "# exposed communication, t_step(N) - t_step(1):"
[ -f "$tmp/steps" ] && awk '{ printf "#   %d peers: %.1f ms\n", $1, ($2 - $3) * 1000 }' \
    "$tmp/steps"
