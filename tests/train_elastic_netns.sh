#!/bin/sh
# tests/train_elastic_netns.sh: a partition under --elastic. 5 hosts in
# network namespaces (scripts/netns.sh: veth pairs on a bridge) train with
# one peer each; after some steps hosts 4 and 5 are moved to a bridge of
# their own, so that {1, 2, 3} and {4, 5} still reach each other but not
# across. The majority (3 of 5) agrees on a new view and finishes (exit 0,
# digests checked, every step and sample counted once); the minority
# never reaches a quorum, trains nothing more, and stops with exit 5 and a
# message that says so. Skips, with the reason, without root, iproute2 or
# namespace support.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
br1_down() { ip link del "${PREFIX}br1" > /dev/null 2>&1; }
T_NETNS_DOWN_FIRST=br1_down
t_netns_up e 5

t_plan 5
N=1200
ITERS=80
: > "$TMP/hosts"
for i in 1 2 3 4 5; do
    echo "10.77.0.$i slots=1" >> "$TMP/hosts"
done
make_secret "$TMP/secret"
# the partition comes from this script once rank 0's metrics reach step
# 15, so the job must still run then, however fast the machine: steps of
# 20 ms at least (MESHTRAIN_TEST_STEP_MS) leave 1.3 s; without, the 65
# steps after step 15 took 0.9 s here, the partition landing at step 22
MESHTRAIN_TEST_STEP_MS=20
export MESHTRAIN_TEST_STEP_MS
PEERS=""
for r in 0 1 2 3 4; do
    MESHTRAIN_TEST_SAMPLES=$TMP/samples bg ip netns exec "$PREFIX$((r + 1))" \
        "$MESHTRAIN" --hostfile "$TMP/hosts" --rank $r --port 29500 \
        --secret-file "$TMP/secret" --model resnet18 --width 4 \
        --cifar-stem --image-size 12 --threads 1 --data-threads 1 --quiet \
        --data synthetic:$N --num-classes 10 --in-channels 1 --batch 4 \
        --no-eval --verify-every 10 --elastic --peer-timeout 2 \
        --join-timeout 60 --iters $ITERS --metrics "$TMP/metrics" \
        > "$TMP/p$r.log" 2>&1
    PEERS="$PEERS $BG_PID"
done
wait_for "$TMP/metrics" '"step": 15,' 120
t_ok $? "5 hosts train"
# the partition: hosts 4 and 5 on a bridge of their own
ip link add "${PREFIX}br1" type bridge &&
    ip link set "${PREFIX}v4" nomaster &&
    ip link set "${PREFIX}v5" nomaster &&
    ip link set "${PREFIX}v4" master "${PREFIX}br1" &&
    ip link set "${PREFIX}v5" master "${PREFIX}br1" &&
    ip link set "${PREFIX}br1" up
t_ok $? "hosts 4 and 5 cut off from hosts 1-3"
wait_all 120
[ "$CODES" = "0 0 0 5 5" ]
t_ok $? "the majority finishes (exit 0), the minority exits 5 (exit codes \
$CODES)"
[ "$CODES" = "0 0 0 5 5" ] || for r in 0 1 2 3 4; do
    t_diag "p$r.log:"
    grep -v "info:" "$TMP/p$r.log" | tail -n 3 | cut -c 1-300 |
        sed 's/^/#   /'
done
grep -q "no quorum for a new view" "$TMP/p3.log" &&
    grep -q "no quorum for a new view" "$TMP/p4.log" &&
    ! grep -q "^[1-9][0-9]* " "$TMP/samples.3" "$TMP/samples.4"
t_ok $? "the minority says it has no quorum and trained in no later view"
grep -h "no quorum" "$TMP/p3.log" | head -n 1 | cut -c 1-200 | sed 's/^/# /'
python3 "$top_srcdir/tests/train_elastic_count.py" "$TMP/metrics" $ITERS $N \
    20 "$TMP"/samples.*
t_ok $? "the majority: every step once, every sample once per epoch"
t_done
