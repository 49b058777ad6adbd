#!/bin/sh
# tests/train_elastic_formation.sh: a peer that dies while view 0's mesh
# forms (doc/elastic.md, "View 0 with spares"). 4 of 5 slots start with
# --elastic (slot 4 is a spare that never comes, so view 0 waits out the
# join timeout); slot 3 is killed once its connections to the others are
# up. The others' joins fail on its closed connections, not on the
# timeout: they still agree on view 1 = slots 0,1,2 (a quorum of the 5),
# from the initial weights, train, and exit 0 (a digest mismatch would
# exit 4); they neither exit 2 (cannot join) nor wait for the timeout.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 2
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:240 --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --iters 20 --elastic --join-timeout 60"

take_ports 5 || t_skip_all "no free ports"
make_secret "$TMP/secret"
PEERS=""
for r in 0 1 2 3; do
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:5 --rank $r --port "$PORT" \
        --secret-file "$TMP/secret" $TINY > "$TMP/form.p$r.log" 2>&1
    PEERS="$PEERS $BG_PID"
    victim=$BG_PID
done

# established TCP connections of process $1 (its sockets in /proc/net/tcp*)
established() {
    _inodes=$(ls -l "/proc/$1/fd" 2>/dev/null |
        sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p' | tr '\n' ' ')
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
        awk -v ino=" $_inodes" '$4 == "01" && index(ino, " " $10 " ")' |
        wc -l
}
# its control and data connection to each of slots 0..2 (1 stream), and
# a moment for their handshakes (local, a few ms). --elastic binds the
# port before the model is built and view 0's mesh accepts: a dial is
# established in the backlog before then, so wait until each of slots
# 0..2 holds its 6 too (its dials, and those it accepted: its mesh took
# them), else a loaded machine kills the victim before the handshakes
# and the others wait out the join timeout instead
all_up() {
    for _p in $PEERS; do
        [ "$(established "$_p")" -ge 6 ] || return 1
    done
}
i=0
until all_up || [ $i -ge 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
sleep 1
kill -KILL "$victim"
wait_all 120
codes_are "0 0 0 137" form
t_ok $? "slot 3 killed while view 0 formed: slots 0, 1 and 2 train and \
exit 0"
grep -q "view 1: slot 3 (localhost:$((PORT + 3))), slot 4 \
(localhost:$((PORT + 4))) left (view 0 did not form); 3 peer(s) \
(slots 0,1,2) continue from step 1" "$TMP/form.p0.log"
t_ok $? "they agree on view 1 = slots 0, 1, 2 from step 1"
t_done
