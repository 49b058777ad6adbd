#!/bin/sh
# bench/elastic_stress.sh: a stress loop of --elastic joins under faults
# (issue 26's view-change agreement). Not part of make check: run it by
# hand, under load, and count the failures per N runs.
#
#   sh bench/elastic_stress.sh [RUNS] [SEED]
#
# Each run starts M = 2..4 members of a job of M + J slots (J = 1 or 2
# joiners, fewer than M, started while the members train) with one fault drawn at
# random:
#   none      the joiners join;
#   stall     a live member runs 10-30 ms in every 160-330 (SIGSTOP and
#             SIGCONT) while the joiners come, as a process on a machine
#             at load 40 (its stalls far below --peer-timeout): no member
#             may be left out;
#   killjoin  a joiner is killed (SIGKILL) 0-1.5 s after it is admitted;
#   stallkill both: a member runs as in stall while a joiner is admitted
#             and killed (the others know of a death, and must still
#             wait for the slow member);
#   stopjoin  a joiner is stopped for 0.5-4 s after it asked to join.
# FAULTS="stall killjoin" draws from those only.
# A run fails when a member does not exit 0, a joiner exits other than 0
# (or 137 when killed, 0, 3 or 5 when stopped), or the counting checks of
# tests/train_elastic_count.py fail (every step once, every sample of an
# epoch once). It prints one line per run, the failures' logs are kept
# under $KEEP (default /tmp/elastic_stress), and a summary at the end.
# shellcheck disable=SC2034 # PEERS, T_PIDS: tests/mesh_lib.sh's
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
# shellcheck source=tests/train_lib.sh
. "$top_srcdir/tests/train_lib.sh"

RUNS=${1:-20}
SEED=${2:-$$}
KEEP=${KEEP:-/tmp/elastic_stress}
mkdir -p "$KEEP"
COUNT="python3 $top_srcdir/tests/train_elastic_count.py"
N=1200
ITERS=${ITERS:-60}
PT=${PT:-2}
TINY="--model resnet18 --width 4 --cifar-stem --image-size 12 --threads 1 \
--data-threads 1 --quiet --data synthetic:$N --num-classes 10 \
--in-channels 1 --batch 4 --no-eval --verify-every 10 --elastic \
--peer-timeout $PT --iters $ITERS"

# a small deterministic random generator: rnd LO HI sets $X (no
# subshell, which would not advance it)
R=$SEED
rnd() {
    R=$(((R * 1103515245 + 12345) % 2147483648))
    X=$(($1 + (R / 65536) % ($2 - $1 + 1)))
}
msleep() { sleep "$(awk "BEGIN { print $1 / 1000 }")"; }
# throttle PID: one period of the CPU a loaded machine leaves a process
# (load 40 on 2 cores): stopped 150-300 ms, then running 10-30 ms
throttle() {
    rnd 150 300
    kill -STOP "$1" 2>/dev/null
    msleep $X
    kill -CONT "$1" 2>/dev/null
    rnd 10 30
    msleep $X
}

fails=0
i=0
while [ $i -lt "$RUNS" ]; do
    i=$((i + 1))
    rnd 2 4
    M=$X
    rnd 1 2
    J=$X
    [ $J -lt $M ] || J=$((M - 1)) # the members are a quorum of the slots
    S=$((M + J))
    # shellcheck disable=SC2086
    set -- ${FAULTS:-none stall killjoin stallkill stopjoin}
    rnd 1 $#
    eval "F=\${$X}"
    name=r$i
    rm -f "$TMP/$name".*
    take_ports "$S" || exit 99
    make_secret "$TMP/secret"
    MEMBERS=""
    JOINERS=""
    r=0
    while [ $r -lt $M ]; do
        # shellcheck disable=SC2086
        bg env MESHTRAIN_TEST_SAMPLES="$TMP/$name.samples" \
            MESHTRAIN_TEST_STEP_MS=30 MESHTRAIN_TEST_JOIN_AT=$((ITERS - 10)) \
            MESHTRAIN_TEST_JOINERS=$J \
            "$MESHTRAIN" -H "localhost:$S" --rank $r --port "$PORT" \
            --secret-file "$TMP/secret" $TINY --join-timeout 3 \
            --metrics "$TMP/$name.metrics" > "$TMP/$name.p$r.log" 2>&1
        MEMBERS="$MEMBERS $BG_PID"
        r=$((r + 1))
    done
    rnd 3 15
    at_step "$name" $X
    while [ $r -lt $S ]; do
        # shellcheck disable=SC2086
        bg env MESHTRAIN_TEST_SAMPLES="$TMP/$name.samples" "$MESHTRAIN" \
            -H "localhost:$S" --rank $r --port "$PORT" \
            --secret-file "$TMP/secret" $TINY --join-timeout 60 \
            > "$TMP/$name.p$r.log" 2>&1
        JOINERS="$JOINERS $BG_PID"
        r=$((r + 1))
    done
    # shellcheck disable=SC2086 # (the words, without the leading blank)
    victim=$(echo $JOINERS | cut -d' ' -f1)
    case $F in
    stall)
        # until the joiners are in (or 150 periods)
        rnd 1 $M
        # shellcheck disable=SC2086
        v=$(echo $MEMBERS | cut -d' ' -f$X)
        k=0
        while [ $k -lt 150 ] && ! grep -q "joined view" "$TMP/$name".p$M.log; do
            throttle "$v"
            k=$((k + 1))
        done
        ;;
    stallkill)
        # until a joiner is admitted (or 150 periods), then 30 more while
        # it is killed 0-1.5 s after
        rnd 1 $M
        # shellcheck disable=SC2086
        v=$(echo $MEMBERS | cut -d' ' -f$X)
        k=0
        while [ $k -lt 150 ] && ! grep -q '"event": "view".*"joined": \[[0-9]' \
            "$TMP/$name.metrics"; do
            throttle "$v"
            k=$((k + 1))
        done
        rnd 0 1500
        (msleep $X && kill -KILL "$victim" 2>/dev/null) &
        k=0
        while [ $k -lt 30 ]; do
            throttle "$v"
            k=$((k + 1))
        done
        ;;
    killjoin)
        wait_for "$TMP/$name.metrics" '"event": "view".*"joined": \[[0-9]' 60
        rnd 0 1500
        msleep $X
        kill -KILL "$victim" 2>/dev/null
        ;;
    stopjoin)
        wait_for "$TMP/$name.p$M.log" "a job is running" 30
        kill -STOP "$victim" 2>/dev/null
        rnd 500 4000
        msleep $X
        kill -CONT "$victim" 2>/dev/null
        ;;
    esac
    PEERS="$MEMBERS"
    wait_all 180
    mcodes=$CODES
    PEERS="$JOINERS"
    wait_all 60
    jcodes=$CODES
    bad=""
    for c in $mcodes; do [ "$c" -eq 0 ] || bad="members $mcodes"; done
    for c in $jcodes; do
        case $F:$c in
        *:0 | *kill*:137 | stopjoin:5 | stopjoin:3) ;;
        *) bad="$bad joiners $jcodes" ;;
        esac
    done
    views=$(grep -c '"event": "view"' "$TMP/$name.metrics" 2>/dev/null)
    if [ -z "$bad" ]; then
        out=$($COUNT "$TMP/$name.metrics" "$ITERS" $N $((S * 4)) \
            "$TMP/$name".samples.* 2>&1) || bad="count: $out"
    fi
    printf '%s run %d: M=%d J=%d %s views %s members %s joiners %s%s\n' \
        "$(date +%T)" $i $M $J "$F" "$views" "$mcodes" "$jcodes" \
        "${bad:+ FAIL $bad}"
    if [ -n "$bad" ]; then
        fails=$((fails + 1))
        mkdir -p "$KEEP/$SEED.$i"
        cp "$TMP/$name".* "$KEEP/$SEED.$i/" 2>/dev/null
    fi
    T_PIDS=""
done
echo "elastic_stress: $fails failure(s) in $RUNS run(s), seed $SEED, \
load $(cut -d' ' -f1-3 /proc/loadavg)"
[ $fails -eq 0 ]
