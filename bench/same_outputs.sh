#!/bin/bash
# bench/same_outputs.sh: a behaviour-preserving change (the refactor that
# moves files into new folders and splits big ones) must leave every output
# bitwise as it was. Builds OLD_REV (default e5bcddb, the commit before the
# refactor) in a temporary git worktree, takes this tree's already-built
# programs as NEW, runs the same commands with each (same flags, same
# relative paths, each in its own output directory) and compares every
# output file pair with cmp.
#
#   bench/same_outputs.sh [--out DIR] [--old-builddir DIR] [OLD_REV]
#
# The commands, all on localhost through meshrun (a fresh secret per job),
# Fashion-MNIST from /usr/share/datasets/fashion-mnist, the tests' small
# model (ResNet-18 of width 16, CIFAR stem, 14 x 14 inputs), one compute
# and one loader thread per peer, batch 8, lr 0.05, no evaluation:
#   allreduce.wrong     meshbench --op allreduce over 4 peers, check on,
#                       for --algo ring tree direct rd rhd ps auto, float
#                       sum and half avg, 4 B .. 2 MiB: per row size,
#                       count, type, redop, root, both #wrong columns and
#                       the algorithm run (auto's choice rests on measured
#                       latencies: left out), the "Out of bounds" line and
#                       the exit status. Every #wrong must be 0 as well.
#   fmnist4_ALGO.st     4 peers, 30 steps, --algo ring, tree, rhd, and ring
#   fmnist4_ALGO.loss   with --compress bf16: the final weights (--save)
#                       and the per-step metrics without their timings
#                       (--metrics minus images_per_s and t_*).
#   devsim2.st .loss    2 peers on --device devsim (the GPU test double,
#                       chunks of 0.05 MiB, copies delayed 200 us), 20 steps
#   resume4.ckpt        4 peers, 15 steps checkpointing at step 15 (rank
#                       0's MANIFEST, which holds the sha256 of every blob
#                       of the checkpoint, the config hash and the weight
#                       digest); then --resume to step 30:
#   resume4.st .loss    the resumed run's final weights and metrics.
# No program dumps the bytes of an all-reduced buffer (meshbench only
# counts wrong elements; its inputs are small integers, exact in any
# order), so the exact bytes of 4-peer all-reduces are covered by the
# fmnist4 weights: every step's gradients are all-reduced in float32 over
# 4 peers, where the order of the additions shows in the last bits.
#
# OLD is configured with this build's own configure flags (config.status
# --config) plus --without-cuda, or with $OLD_CONFIGURE_FLAGS, and only
# meshtrain, meshrun and meshbench are built (make -j2). --old-builddir DIR
# takes OLD's programs from DIR instead (nothing built; OLD_REV is then
# only a label). NEW's programs come from $top_builddir, else the current
# directory when it has them, else this tree's root.
#
# Prints a TAP-like table (one line per file: same or DIFFERENT, with the
# sha256; for a difference both) and exits like cmp: 0 when every pair is
# bitwise identical (and no #wrong), 1 when something differs or is
# missing, 2 when it could not compare (NEW not built, OLD_REV unknown or
# OLD's build failed). --out DIR keeps the outputs (DIR/old, DIR/new) and
# the logs (DIR/logs-old, DIR/logs-new); without it everything lives in a
# temporary directory that is removed on exit, with the worktree.
# About a minute on 2 cores: 20 s for OLD's build, 20 s of runs per side.
set -u
srcdir=$(cd "$(dirname "$0")/.." && pwd)
out=
old_builddir=
old_rev=
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --old-builddir) old_builddir=${2:?--old-builddir needs a directory}
                    shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "usage: $0 [--out DIR] [--old-builddir DIR] [OLD_REV]" >&2
        exit 2 ;;
    *) [ -z "$old_rev" ] || { echo "$0: one OLD_REV only" >&2; exit 2; }
       old_rev=$1; shift ;;
    esac
done
old_rev=${old_rev:-e5bcddb}

die() { echo "$(basename "$0"): $*" >&2; exit 2; }
log() { echo "# [$(date +%H:%M:%S)] $*"; }

# NEW: this tree's programs, built beforehand.
if [ -n "${top_builddir:-}" ]; then
    new_bin=$(cd "$top_builddir" && pwd)
elif [ -x ./meshtrain ] && [ -x ./meshrun ] && [ -x ./meshbench ]; then
    new_bin=$(pwd)
else
    new_bin=$srcdir
fi
for p in meshtrain meshrun meshbench; do
    [ -x "$new_bin/$p" ] ||
        die "NEW: $new_bin/$p is not built; build this tree first" \
            "(./autogen.sh && ./configure && make -j2), or set top_builddir"
done
stale=$(find "$srcdir" -path "$srcdir/.git" -prune -o \
        \( -name '*.c' -o -name '*.h' \) -newer "$new_bin/meshtrain" -print \
        2>/dev/null | head -n 1)
[ -z "$stale" ] ||
    log "warning: $stale is newer than $new_bin/meshtrain: run make first?"

[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    die "no Fashion-MNIST in /usr/share/datasets/fashion-mnist"
command -v sha256sum >/dev/null || die "sha256sum not found"

# take_ports N: the tests' free-port blocks (flock, never meshtrain's
# default ports).
# shellcheck source=/dev/null
. "$srcdir/tests/ports.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/same_outputs.XXXXXX") || exit 2
wt=
# shellcheck disable=SC2317
cleanup() {
    if [ -n "$wt" ]; then
        # remove, not prune: other worktrees' entries stay as they are
        git -C "$srcdir" worktree remove --force "$wt" >/dev/null 2>&1 ||
            { rm -rf "$wt"
              echo "# could not remove worktree $wt: git worktree prune" >&2; }
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -n "$out" ]; then
    mkdir -p "$out" || die "cannot create $out"
    out=$(cd "$out" && pwd)
    rm -rf "$out/old" "$out/new" "$out/logs-old" "$out/logs-new"
else
    out=$tmp
fi

start=$SECONDS
log "NEW: $new_bin ($(git -C "$srcdir" describe --always --dirty 2>/dev/null))"

# OLD: OLD_REV built in a temporary worktree, or programs given.
if [ -n "$old_builddir" ]; then
    old_bin=$(cd "$old_builddir" 2>/dev/null && pwd) ||
        die "--old-builddir $old_builddir: no such directory"
    for p in meshtrain meshrun meshbench; do
        [ -x "$old_bin/$p" ] || die "OLD: $old_bin/$p is not built"
    done
    log "OLD: $old_bin (given; labelled $old_rev)"
else
    sha=$(git -C "$srcdir" rev-parse --verify --quiet "$old_rev^{commit}") ||
        die "OLD_REV '$old_rev' is not a commit of $srcdir"
    wt=$tmp/old-src
    git -C "$srcdir" worktree add --detach "$wt" "$sha" >/dev/null 2>&1 ||
        die "git worktree add $wt $old_rev failed"
    if [ -n "${OLD_CONFIGURE_FLAGS+set}" ]; then
        eval "set -- $OLD_CONFIGURE_FLAGS"
    elif [ -x "$new_bin/config.status" ]; then
        eval "set -- $("$new_bin/config.status" --config) --without-cuda"
    else
        set -- --without-cuda
    fi
    log "OLD: $old_rev ($sha), building in $wt: configure $*"
    (cd "$wt" && ./autogen.sh && ./configure "$@" &&
     make -j2 meshtrain meshrun meshbench) > "$tmp/old-build.log" 2>&1 || {
        tail -n 30 "$tmp/old-build.log" >&2
        die "building $old_rev failed (log above)"
    }
    old_bin=$wt
    log "OLD built in $((SECONDS - start)) s"
fi

# The environment every run sees: none of the mesh's variables from
# outside, info logs (the resumed run says from which step), the devsim
# delays fixed.
unset MESHTRAIN_HOSTFILE MESHTRAIN_HOSTS MESHTRAIN_RANK MESHTRAIN_SIZE \
      MESHTRAIN_SECRET_FILE MESHTRAIN_SECRET_FD MESHTRAIN_INSECURE \
      MESHTRAIN_PORT MESHTRAIN_PORT_RANGE MESHTRAIN_JOB_ID \
      MESHTRAIN_TCP_CONGESTION MESHTRAIN_STREAMS MESHTRAIN_TRANSPORT \
      MESHTRAIN_BIND_TO MESHTRAIN_JOIN_TIMEOUT MESHTRAIN_PEER_TIMEOUT \
      MESHTRAIN_DEVSIM_COPY_ORDER MESHBENCH_TEST_CORRUPT \
      MESHTRAIN_TEST_SLOW SLURM_PROCID SLURM_NTASKS SLURM_JOB_ID \
      OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE
export MESHTRAIN_LOG=info OMP_WAIT_POLICY=passive MESHTRAIN_DEVSIM_COPY_US=200

SMALL="--model resnet18 --width 16 --cifar-stem --image-size 14 \
--threads 1 --data-threads 1 --quiet"
TRAIN="$SMALL --data fashion-mnist --batch 8 --lr 0.05 --no-eval \
--verify-every 5 --bucket-mb 0.25 --join-timeout 60"
FAILED_RUNS=0

# mesh NAME NP PROG ARGS...: NP peers of PROG (meshtrain or meshbench,
# $bin's) through $bin/meshrun on free ports, in the current directory;
# output in $logs/NAME.log; a failure is told on file descriptor 3 (the
# script's standard output).
mesh() {
    _name=$1 _np=$2 _prog=$3
    shift 3
    take_ports "$_np" || { echo "# $side $_name: no free ports" >&3
                           FAILED_RUNS=$((FAILED_RUNS + 1)); return 1; }
    timeout 300 "$bin/meshrun" -np "$_np" -- "$bin/$_prog" --port "$PORT" \
        "$@" > "$logs/$_name.log" 2>&1
    _rc=$?
    if [ $_rc -ne 0 ]; then
        { echo "# $side $_name: exit $_rc"
          tail -n 10 "$logs/$_name.log" | sed 's/^/#   /'; } >&3
        FAILED_RUNS=$((FAILED_RUNS + 1))
    fi
    return $_rc
}

# loss JSONL: the metrics without what depends on the clock
loss() {
    sed -E 's/, "(images_per_s|t_[a-z_]+)": [^,}]*//g' "$1"
}

# run_all SIDE BIN: every command with BIN's programs, outputs in
# $out/SIDE, logs in $out/logs-SIDE.
run_all() {
    side=$1 bin=$2
    logs=$out/logs-$side
    mkdir -p "$out/$side" "$logs"
    cd "$out/$side" || return 1
    log "$side: meshbench all-reduce, 4 peers"
    for dt in "float -o sum" "half -o avg"; do
        for algo in ring tree direct rd rhd ps auto; do
            name=allreduce-$algo-${dt%% *}
            # shellcheck disable=SC2086
            mesh "$name" 4 meshbench --join-timeout 60 --op allreduce \
                --algo $algo -d $dt -b 4 -e 2M -f 8 -n 1 -w 1
            echo "== $name: exit $?"
            # [0] size count type redop root time algbw busbw #wrong
            # time algbw busbw #wrong algo
            awk -v auto="$([ $algo = auto ] && echo 1 || echo 0)" '
                $1 == "[0]" && NF == 15 && $2 ~ /^[0-9]+$/ {
                    print $2, $3, $4, $5, $6, "wrong", $10, $14,
                          auto ? "-" : $15 }
                /Out of bounds values/ { sub(/^\[0\] /, ""); print }' \
                "$logs/$name.log"
        done
    done > allreduce.wrong
    for algo in ring tree rhd ring-bf16; do
        log "$side: Fashion-MNIST, 4 peers, $algo, 30 steps"
        case $algo in
        *-bf16) flags="--algo ${algo%-bf16} --compress bf16" ;;
        *) flags="--algo $algo" ;;
        esac
        # shellcheck disable=SC2086
        mesh "fmnist4_$algo" 4 meshtrain $TRAIN --iters 30 $flags \
            --save "fmnist4_$algo.st" --metrics "fmnist4_$algo.jsonl" &&
            loss "fmnist4_$algo.jsonl" > "fmnist4_$algo.loss"
    done
    log "$side: devsim, 2 peers, 20 steps"
    # shellcheck disable=SC2086
    mesh devsim2 2 meshtrain $TRAIN --iters 20 --algo ring \
        --device devsim --chunk-mb 0.05 \
        --save devsim2.st --metrics devsim2.jsonl &&
        loss devsim2.jsonl > devsim2.loss
    log "$side: 4 peers, 15 steps with a checkpoint, then --resume to 30"
    # shellcheck disable=SC2086
    mesh resume4-first 4 meshtrain $TRAIN --iters 15 --algo ring \
        --checkpoint-every 15 --checkpoint-dir ckpt &&
        cp ckpt/rank-0/ckpt-000000015/MANIFEST resume4.ckpt
    # shellcheck disable=SC2086
    mesh resume4 4 meshtrain $TRAIN --iters 30 --algo ring \
        --checkpoint-every 15 --checkpoint-dir ckpt --resume \
        --save resume4.st --metrics resume4.jsonl &&
        loss resume4.jsonl > resume4.loss
    grep -q 'resumed from step 15' "$logs/resume4.log" ||
        { echo "# $side resume4: no 'resumed from step 15' in its log"
          FAILED_RUNS=$((FAILED_RUNS + 1)); }
    cd - >/dev/null || return 1
}

exec 3>&1
t_run=$SECONDS
run_all old "$old_bin"
run_all new "$new_bin"
log "runs took $((SECONDS - t_run)) s"

FILES="allreduce.wrong"
for algo in ring tree rhd ring-bf16; do
    FILES="$FILES fmnist4_$algo.st fmnist4_$algo.loss"
done
FILES="$FILES devsim2.st devsim2.loss resume4.ckpt resume4.st resume4.loss"

bad=0
n=0
# shellcheck disable=SC2086
set -- $FILES
echo "1..$(($# + 1))"
for f in $FILES; do
    n=$((n + 1))
    a=$out/old/$f b=$out/new/$f
    if [ ! -s "$a" ] || [ ! -s "$b" ]; then
        echo "not ok $n - $f MISSING (old: $([ -s "$a" ] && echo ok ||
              echo none), new: $([ -s "$b" ] && echo ok || echo none))"
        bad=1
    elif cmp -s "$a" "$b"; then
        echo "ok $n - $f same $(sha256sum < "$b" | cut -d' ' -f1)"
    else
        echo "not ok $n - $f DIFFERENT old $(sha256sum < "$a" |
              cut -d' ' -f1) new $(sha256sum < "$b" | cut -d' ' -f1)"
        cmp "$a" "$b" 2>&1 | sed 's/^/#   /'
        bad=1
    fi
done
# meshbench's #wrong must be 0 on both sides, every run must have exited 0
n=$((n + 1))
nonzero=$(cat "$out/old/allreduce.wrong" "$out/new/allreduce.wrong" \
          2>/dev/null | awk '$6 == "wrong" && ($7 != 0 || $8 != 0) { k++ }
                             /^== .*exit [1-9]/ { k++ } END { print k + 0 }')
rows=$(awk '$6 == "wrong" { k++ } END { print k + 0 }' \
       "$out/new/allreduce.wrong" 2>/dev/null)
if [ "$nonzero" -eq 0 ] && [ "$FAILED_RUNS" -eq 0 ] && [ "${rows:-0}" -gt 0 ]
then
    echo "ok $n - every run exited 0; #wrong 0 in all $rows meshbench rows per side"
else
    echo "not ok $n - $FAILED_RUNS run(s) failed; $nonzero meshbench rows" \
         "or runs with wrong values"
    bad=1
fi
log "OLD $old_rev against NEW $(git -C "$srcdir" describe --always --dirty \
    2>/dev/null): $([ $bad -eq 0 ] && echo "all bitwise identical" ||
    echo "DIFFERENCES") in $((SECONDS - start)) s"
exit $bad
