#!/bin/sh
# tests/train_elastic_faults.sh: --elastic at the moments that matter.
# 6 peers train a tiny ResNet-18 with evaluations and checkpoints every 10
# steps; MESHTRAIN_TEST_FAULT makes one or two of them raise SIGKILL or
# SIGSTOP at an exact moment: during a gradient bucket's all-reduce,
# between two steps, in the middle of writing a checkpoint, during an
# evaluation, or during the view agreement itself (a second failure while
# the view changes). Every survivor finishes with exit 0 (so every digest
# check, after each view change and at the end, agreed); a stopped peer,
# continued once the others moved on, exits 5 (left out); the metrics name
# every step once and every sample of each epoch is used once
# (tests/train_elastic_count.py).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

command -v python3 > /dev/null || t_skip_all "python3 not found"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
N=1200
BATCH=4
ITERS=40
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch $BATCH --eval-every 0.2 --verify-every 10 \
--elastic --join-timeout 60 --iters $ITERS \
--checkpoint-every 10 --keep 1"

# name|MESHTRAIN_TEST_FAULT|exit codes of slots 0..5|what
CASES="kill_ar|2:allreduce:14|0 0 137 0 0 0|SIGKILL during an all-reduce
kill_ck|4:checkpoint:19|0 0 0 0 137 0|SIGKILL while writing a checkpoint
kill_ev|1:eval:19|0 137 0 0 0 0|SIGKILL during an evaluation
kill_ag|5:between:14,3:agree:0|0 0 0 137 0 137|SIGKILL between steps, \
then a second SIGKILL during the agreement
kill_2|0:allreduce:14,5:allreduce:14|137 0 0 0 0 137|SIGKILL of two \
peers (rank 0 one of them) in one all-reduce
stop_ar|2:allreduce:14:stop|0 0 5 0 0 0|SIGSTOP during an all-reduce
stop_ck|1:checkpoint:19:stop|0 5 0 0 0 0|SIGSTOP while writing a checkpoint
stop_ev|3:eval:19:stop|0 0 0 5 0 0|SIGSTOP during an evaluation
stop_2|2:between:14:stop,4:between:14:stop|0 0 5 0 5 0|SIGSTOP of two \
peers between steps
stop_ag|4:allreduce:14,1:agree:0:stop|0 5 0 0 137 0|SIGKILL during an \
all-reduce, then a SIGSTOP during the agreement"

t_plan "$(printf '%s\n' "$CASES" | grep -c '^[a-z]')"

printf '%s\n' "$CASES" | grep '^[a-z]' > "$TMP/cases"
while IFS='|' read -r name fault want what; do
    rm -rf "$TMP/ck"
    MESHTRAIN_TEST_SAMPLES=$TMP/$name.samples
    MESHTRAIN_TEST_FAULT=$fault
    export MESHTRAIN_TEST_SAMPLES MESHTRAIN_TEST_FAULT
    # shellcheck disable=SC2086
    # a SIGKILL is seen at once (EOF); a SIGSTOP after --peer-timeout,
    # which is long for the others so that a loaded machine's scheduling
    # stalls do not look like deaths
    case $name in
    stop_*) pt=2 ;;
    *) pt=10 ;;
    esac
    by_hand 6 "$TMP/$name.p" $TINY --metrics "$TMP/$name.metrics" \
        --checkpoint-dir "$TMP/ck" --peer-timeout $pt
    unset MESHTRAIN_TEST_SAMPLES MESHTRAIN_TEST_FAULT
    case $name in
    stop_*)
        # wait until every stopped peer is in a view change's "left" list,
        # then continue it: a view change that leaves nobody out (a loaded
        # machine's slow member, waited for) may come before the stops
        _stopped=$(printf '%s\n' "$fault" | tr ',' '\n' |
            sed -n 's/^\([0-9]*\):.*:stop$/\1/p')
        _i=0
        while [ $_i -lt 600 ]; do
            _left=$(grep -h "view [0-9]*: slot" "$TMP/$name".p*.log |
                sed 's/ left .*//')
            _all=1
            for _r in $_stopped; do
                case $_left in
                *"slot $_r ("*) ;;
                *) _all=0 ;;
                esac
            done
            [ $_all = 1 ] && break
            sleep 0.1
            _i=$((_i + 1))
        done
        for _r in 0 1 2 3 4 5; do
            if grep -q "signal 19" "$TMP/$name.p$_r.log"; then
                set -- $PEERS
                shift "$_r"
                kill -CONT "$1"
            fi
        done
        ;;
    esac
    wait_all 120
    ok=0
    if [ "$CODES" != "$want" ]; then
        t_diag "$name: exit codes $CODES, want $want"
        for f in "$TMP/$name".p*.log; do
            t_diag "$f:"
            grep -v "info:" "$f" | tail -n 4 | cut -c 1-300 | sed 's/^/#   /'
        done
        ok=1
    fi
    $COUNT "$TMP/$name.metrics" $ITERS $N $((6 * BATCH)) \
        "$TMP/$name".samples.* || ok=1
    grep -h "view [0-9]*:" "$TMP/$name".p*.log | cut -c 1-160 |
        sed 's/^/# /'
    t_ok $ok "$what: the others finish, every step and sample once \
(exit codes $CODES)"
done < "$TMP/cases"
t_done
