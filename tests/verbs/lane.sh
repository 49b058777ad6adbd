#!/bin/sh
# tests/verbs/lane.sh: the verbs transport on a real RDMA stack without RDMA
# hardware. Boots Debian's stock kernel (linux-image-amd64, downloaded with
# apt-get download, never installed) under QEMU/TCG with Soft-RoCE
# (rdma_rxe), shares the host's root read-only over virtio-9p, and runs the
# project's own tests inside (tests/verbs/guest.sh): ibv_rc_pingpong, the
# verbs checks (tests/verbs/test_verbs), the transport conformance suite,
# the collectives over verbs and --elastic over verbs (one of 3 training
# peers killed, the other two go on; then it is started again, catches up
# over RDMA while they train, and rejoins; the fallbacks to TCP and a
# forged rkey on the way, and a second restart without an RDMA device,
# which catches up over TCP); then two guests joined by one
# virtio-net link, two "hosts" with their own rxe, run meshbench and a
# 2-peer training step.
# A TAP skip, with the reason, where qemu or the kernel package is missing.
#
# Environment: MESHTRAIN_VERBS_LANE=0 skips it; VERBS_PARTS picks parts
# (pingpong verbs transport collective auto elastic rejoin hosts hosts4 perf;
# auto runs the collectives battery over the default transport on 2
# pretended hosts of 2 in one guest; perf adds perftest's
# ib_write_bw against meshbench on the two-guest link); VERBS_CACHE (default
# /var/tmp/meshtrain-verbs-UID) holds the kernel and initramfs. The guest's
# /tmp is its own: VERBS_LOGS=1 brings its peers' logs back (the rejoin
# part's /tmp/rj.*, printed on the console as "VERBS-LOG NAME: line") into
# tests/verbs/lane-logs/NAME; a failed rejoin check brings them back
# without it. VERBS_RJ_ITERS, VERBS_RJ_STEP_MS and MESHTRAIN_LOG pass into
# the guest.
srcdir=${srcdir:-.}
S=$(cd "$srcdir" && pwd)
B=$(pwd)
. "$S/tests/verbs/lib.sh"
. "$S/tests/ports.sh"

skip_all() {
    echo "1..0 # SKIP $*"
    exit 0
}

[ "${MESHTRAIN_VERBS_LANE:-1}" = 0 ] && skip_all "MESHTRAIN_VERBS_LANE=0"
[ -x "$B/tests/verbs/test_verbs" ] || skip_all "verbs support not built"
# The guest mounts a fresh /tmp; the first folder under /tmp of the build
# and source trees (when they live there) stays visible in it.
VERBS_KEEP=
for d in "$B" "$S"; do
    case $d in
    /tmp/*/* | /tmp/*)
        k=${d#/tmp/}
        k=${k%%/*}
        case $k in
        *[!A-Za-z0-9._-]*) skip_all "the tree $d has odd characters for the guest's command line" ;;
        esac
        VERBS_KEEP=${VERBS_KEEP:+$VERBS_KEEP,}$k
        ;;
    esac
done
export VERBS_KEEP
verbs_prepare || skip_all "$verbs_why"

PARTS=${VERBS_PARTS:-pingpong verbs transport collective elastic rejoin hosts}
one=
pair=0
perf=0
hosts=
for p in $PARTS; do
    case $p in
    hosts | hosts4) pair=1 hosts="$hosts $p" ;;
    perf) pair=1 perf=1 hosts="$hosts hosts" ;;
    *) one="$one $p" ;;
    esac
done
log=$B/tests/verbs/lane-console.log
: >"$log"
qrc=0
pair_qemu=
start=$(date +%s)
if [ -n "$one" ]; then
    job=$VERBS_CACHE/job-$$.sh
    cat >"$job" <<JOB
VERBS_PARTS="$one"
export VERBS_PARTS
$(for v in VERBS_LOGS VERBS_RJ_ITERS VERBS_RJ_STEP_MS MESHTRAIN_LOG; do
        eval "x=\${$v:-}"
        case $x in
        *[!A-Za-z0-9,._-]*) ;;
        ?*) echo "$v=$x; export $v" ;;
        esac
    done)
sh "$S/tests/verbs/guest.sh" "$B" "$S"
JOB
    verbs_boot "$job" "$log.s"
    qrc=$?
    rm -f "$job"
    cat "$log.s" >>"$log"
fi
if [ "$pair" = 1 ]; then
    # Two guests, one link: the multi-host path. The job secret is shared
    # through the host's (read-only) root, mode 0600.
    secret=$VERBS_CACHE/secret-$$
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret")
    for r in 0 1; do
        cat >"$VERBS_CACHE/job-$$-$r.sh" <<JOB
VERBS_PERF=$perf
VERBS_HOSTS="$hosts"
export VERBS_PERF VERBS_HOSTS
sh "$S/tests/verbs/guest-host.sh" $r "$B" "$S" "$secret"
JOB
    done
    # A guest that never starts its job stops the pair (verbs_boot_pair);
    # the pair boots once more, its first consoles kept in the log.
    for try in 1 2; do
        verbs_boot_pair "$VERBS_CACHE/job-$$-0.sh" "$log.0" \
            "$VERBS_CACHE/job-$$-1.sh" "$log.1"
        prc=$?
        pair_qemu="qemu exit $verbs_qrc0 and $verbs_qrc1"
        [ "$prc" = 2 ] && [ "$try" = 1 ] || break
        echo "# two-host pair, boot $try: $verbs_why ($pair_qemu); booting the pair again"
        for r in 0 1; do
            echo "# guest $r console (boot $try), last lines:"
            tr -d '\r' <"$log.$r" | tail -n 15 | sed 's/^/#   /'
            sed 's/VERBS-\(TAP\|GUEST\)/(boot 1) \1/' "$log.$r" >>"$log.stalled"
        done
    done
    rm -f "$VERBS_CACHE/job-$$-0.sh" "$VERBS_CACHE/job-$$-1.sh" "$secret"
    cat "$log.0" "$log.1" >>"$log"
    [ -f "$log.stalled" ] && cat "$log.stalled" >>"$log"
    rm -f "$log.stalled"
fi
end=$(date +%s)

n=0
tr -d '\r' <"$log" | sed -n 's/^VERBS-TAP //p' >"$log.tap"
# the guests' logs (VERBS_LOGS=1, or a failed check): one file each
logs=$B/tests/verbs/lane-logs
rm -rf "$logs"
if grep -q "^VERBS-LOG [A-Za-z0-9._-]*: " "$log"; then
    mkdir -p "$logs"
    tr -d '\r' <"$log" | awk -v d="$logs" '
        /^VERBS-LOG [A-Za-z0-9._-]+: / {
            f = $2; sub(/:$/, "", f); l = $0; sub(/^VERBS-LOG [^ ]+ /, "", l)
            print l >(d "/" f) }'
    echo "# the guests' logs: $logs ($(ls "$logs" | tr '\n' ' '))"
fi
while IFS= read -r line; do
    case $line in
    "#"*) echo "$line" ;;
    "ok - "*) n=$((n + 1)); echo "ok $n - ${line#ok - }" ;;
    "not ok - "*) n=$((n + 1)); echo "not ok $n - ${line#not ok - }" ;;
    "skip - "*) n=$((n + 1)); echo "ok $n # SKIP ${line#skip - }" ;;
    esac
done <"$log.tap"
n=$((n + 1))
want=$(( $([ -n "$one" ] && echo 1 || echo 0) + 2 * pair ))
got=$(grep -c "VERBS-GUEST: exit" "$log")
if [ "$got" = "$want" ]; then
    echo "ok $n - $want guest(s) ran the lane to the end ($((end - start)) s)"
else
    echo "not ok $n - $got of $want guest(s) finished (qemu exit $qrc${pair_qemu:+; pair $pair_qemu}${verbs_why:+; $verbs_why}; console in $log)"
    # The consoles of the guests that did not finish.
    for f in "$log.s" "$log.0" "$log.1"; do
        [ -f "$f" ] || continue
        grep -q "VERBS-GUEST: exit" "$f" && continue
        echo "# ${f##*/}, last lines:"
        tr -d '\r' <"$f" | tail -n 20 | sed 's/^/#   /'
    done
fi
rm -f "$log.s" "$log.0" "$log.1"
echo "1..$n"
