#!/bin/sh
# tests/verbs/lane.sh: the verbs transport on a real RDMA stack without RDMA
# hardware. Boots Debian's stock kernel (linux-image-amd64, downloaded with
# apt-get download, never installed) under QEMU/TCG with Soft-RoCE
# (rdma_rxe), shares the host's root read-only over virtio-9p, and runs the
# project's own tests inside (tests/verbs/guest.sh): ibv_rc_pingpong, the
# verbs checks (tests/verbs/test_verbs), the transport conformance suite and
# the collectives over verbs, and two "hosts" (network namespaces with their
# own rxe over a veth pair) running meshbench and a 2-peer training step.
# A TAP skip, with the reason, where qemu or the kernel package is missing.
#
# Environment: MESHTRAIN_VERBS_LANE=0 skips it; VERBS_PARTS picks parts
# (pingpong verbs transport collective hosts perf); VERBS_CACHE (default
# /var/tmp/meshtrain-verbs-UID) holds the kernel and initramfs.
srcdir=${srcdir:-.}
S=$(cd "$srcdir" && pwd)
B=$(pwd)
. "$S/tests/verbs/lib.sh"

skip_all() {
    echo "1..0 # SKIP $*"
    exit 0
}

[ "${MESHTRAIN_VERBS_LANE:-1}" = 0 ] && skip_all "MESHTRAIN_VERBS_LANE=0"
[ -x "$B/tests/verbs/test_verbs" ] || skip_all "verbs support not built"
case "$B/:$S/" in
/tmp/* | *:/tmp/*) skip_all "the build tree is under /tmp, which the guest mounts over" ;;
esac
verbs_prepare || skip_all "$verbs_why"

job=$VERBS_CACHE/job-$$.sh
log=$B/tests/verbs/lane-console.log
cat >"$job" <<JOB
VERBS_PARTS="${VERBS_PARTS:-pingpong verbs transport collective hosts}"
export VERBS_PARTS
sh "$S/tests/verbs/guest.sh" "$B" "$S"
JOB
start=$(date +%s)
verbs_boot "$job" "$log"
qrc=$?
rm -f "$job"
end=$(date +%s)

n=0
tr -d '\r' <"$log" | sed -n 's/^VERBS-TAP //p' >"$log.tap"
while IFS= read -r line; do
    case $line in
    "#"*) echo "$line" ;;
    "ok - "*) n=$((n + 1)); echo "ok $n - ${line#ok - }" ;;
    "not ok - "*) n=$((n + 1)); echo "not ok $n - ${line#not ok - }" ;;
    "skip - "*) n=$((n + 1)); echo "ok $n # SKIP ${line#skip - }" ;;
    esac
done <"$log.tap"
n=$((n + 1))
if grep -q "VERBS-GUEST: exit" "$log"; then
    echo "ok $n - the guest ran the lane to the end ($((end - start)) s)"
else
    echo "not ok $n - the guest did not finish (qemu exit $qrc; console in $log)"
    tail -n 20 "$log" | sed 's/^/# /'
fi
echo "1..$n"
