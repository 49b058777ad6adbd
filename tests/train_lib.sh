# tests/train_lib.sh: shared pieces of the meshtrain scenario scripts
# (sourced after tests/mesh_lib.sh's conventions: TAP helpers, free ports,
# background processes killed by pid on exit, $TMP removed on exit).
#
# Sets MESHTRAIN and SMALL, the arguments of a small, fast model: a
# ResNet-18 of width 16 with the CIFAR stem on 14 x 14 inputs (about 0.7 M
# parameters, a few ms per sample on one core), one compute thread and one
# loader thread per peer, since the 2-core test machine runs several peers
# and other tests at once.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

MESHTRAIN=$top_builddir/meshtrain
[ -x "$MESHTRAIN" ] || t_skip_all "meshtrain not built in $top_builddir"
SMALL="--model resnet18 --width 16 --cifar-stem --image-size 14 \
--threads 1 --data-threads 1 --quiet"
FMNIST=/usr/share/datasets/fashion-mnist
export OMP_WAIT_POLICY=passive

# by_hand N LOGPREFIX ARGS...: start N peers of meshtrain by hand on free
# ports with a fresh secret; their pids in $PEERS, logs LOGPREFIX$r.log.
by_hand() {
    _n=$1
    _log=$2
    shift 2
    take_ports "$_n" || return 1
    _port=$PORT
    make_secret "$TMP/secret"
    PEERS=""
    _r=0
    while [ $_r -lt "$_n" ]; do
        bg "$MESHTRAIN" -H "localhost:$_n" --rank $_r --port "$_port" \
            --secret-file "$TMP/secret" "$@" > "$_log$_r.log" 2>&1
        PEERS="$PEERS $BG_PID"
        _r=$((_r + 1))
    done
}

# wait_all SECONDS: wait for every pid in $PEERS; $CODES gets their exit
# codes ("0 0 3"), 255 for one still running after SECONDS (then killed).
wait_all() {
    CODES=""
    for _p in $PEERS; do
        wait_exit "$_p" "$1"
        CODES="$CODES $EXIT_CODE"
    done
    CODES=${CODES# }
}

# chunks_ok TIMELINE: the test that the pipeline ran in chunks: bucket 1's
# second chunk went out to the host, through the all-reduce and back, each
# on its track of rank 0's --timeline file TIMELINE (every event must be
# there, not only the last one looked for).
chunks_ok() {
    _missing=0
    for _ev in '"copy to host bucket 1 chunk 1", "cat": "copies"' \
        '"allreduce bucket 1 chunk 1", "cat": "communication"' \
        '"copy to device bucket 1 chunk 1", "cat": "copies"'; do
        grep -q "$_ev" "$1" || { t_diag "no event $_ev"; _missing=1; }
    done
    t_ok $_missing "the timeline shows each chunk's copies and all-reduce"
}

# at_step NAME K: wait (up to 120 s) until $TMP/NAME.metrics records step K.
at_step() {
    wait_for "$TMP/$1.metrics" "\"step\": $2," 120
}

# codes_are "CODES" NAME: the peers' exit codes ($CODES) are CODES; else show
# the end of each $TMP/NAME.p*.log and fail.
codes_are() {
    [ "$CODES" = "$1" ] && return 0
    t_diag "exit codes $CODES, want $1"
    for _f in "$TMP/$2".p*.log; do
        t_diag "$_f:"
        t_show "$_f" 8
    done
    return 1
}

# pick INDEX LIST...: the (INDEX mod count)-th word of LIST (the sweeps'
# way through their axes, scripts/*_sweep.sh).
pick() {
    _i=$1
    shift
    _n=$#
    _i=$((_i % _n + 1))
    eval "echo \${$_i}"
}

# sweep_hosts LETTERS: LAUNCH and HOSTNET of the sweeps' hostfiles
# (scripts/*_sweep.sh): meshrun's local launcher on 127.0.0.x, or, with
# SWEEP_NETNS set, 4 namespace hosts (10.77.0.x, prefix LETTERS) reached
# through t_netns_agent; exits where those cannot be made.
sweep_hosts() {
    LAUNCH="--launcher local"
    HOSTNET=127.0.0
    [ -n "${SWEEP_NETNS:-}" ] || return 0
    t_netns_try "$1" 4 || { echo "$NETNS_WHY" >&2; exit 1; }
    t_netns_agent "$TMP/agent"
    LAUNCH="--launcher ssh --ssh $TMP/agent"
    HOSTNET=10.77.0
}
