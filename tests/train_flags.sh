#!/bin/sh
# tests/train_flags.sh: no flag can make peers compute different things
# unnoticed. Every flag that meshtrain --help lists (its own and the mesh
# flags) must be in exactly one of three lists:
#   REFUSED   changing it on one peer makes the join fail (exit 2) with
#             the configuration field named: it changes the math (what a
#             peer computes, or when it joins a collective);
#   SAME      changing it on one peer still gives bitwise the same final
#             weights as a uniform run: it does not change the math;
#   UNTESTED  it cannot be changed on one peer here, with the reason.
# A flag in no list (a new one) fails the test: decide where it goes, and
# if it changes the math, put it in the configuration fingerprint
# (build_config in train/train.c).
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

# No --quiet and no switches here: every switch is changed by adding it.
BASE="--model resnet18 --width 16 --image-size 16 --in-channels 1 \
--num-classes 10 --data synthetic:64 --batch 8 --threads 1 \
--data-threads 1 --join-timeout 20"

# flag|arguments for one peer|the field the refusal must name|arguments
# for both peers
REFUSED="model|--model resnet34|model|
width|--width 32|width|
num-classes|--num-classes 12|classes|
image-size|--image-size 20|image_size|
in-channels|--in-channels 3|channels|
cifar-stem|--cifar-stem|cifar_stem|
zero-init-residual|--zero-init-residual|zero_init_residual|
seed|--seed 2|seed|
threads|--threads 2|threads|
device|--device devsim|device|
precision|--precision fp32|precision|
data|--data synthetic:128|data[a-z_]*|
augment|--augment on|augment|
on-bad-sample|--on-bad-sample skip|on_bad_sample|
batch|--batch 4|batch|
accumulate|--accumulate 2|accumulate|
epochs|--epochs 2|total_steps|
iters|--iters 2|total_steps|
lr|--lr 0.05|lr|
momentum|--momentum 0.5|momentum|
weight-decay|--weight-decay 0.001|weight_decay|
nesterov|--nesterov|nesterov|
lr-schedule|--lr-schedule cosine|lr_schedule|
warmup-epochs|--warmup-epochs 1|warmup_epochs|
milestones|--milestones 1,2|milestones|--lr-schedule step
label-smoothing|--label-smoothing 0.1|label_smoothing|
bucket-mb|--bucket-mb 0.5|bucket_mb|
chunk-mb|--chunk-mb 1|chunk_mb|
compress|--compress fp16|compress|
no-error-feedback|--no-error-feedback|error_feedback|--compress topk:0.1
algo|--algo ring|algo|
verify-every|--verify-every 1|verify_every|
eval-every|--eval-every 0.5|eval_every|
no-eval|--no-eval|eval|
checkpoint-every|--checkpoint-every 2 --checkpoint-dir TMP/ck|checkpoint_every|
resume|--resume=if-any --checkpoint-dir TMP/ck|resume|
freeze|--freeze conv1|freeze|
predict|--predict TMP|predict|
simulate-compute|--simulate-compute k80|[a-z_]*|
simulate-scale|--simulate-scale 4|data|--simulate-compute k80
simulate-gpus|--simulate-gpus 2|data|--simulate-compute k80
elastic|--elastic|elastic|
min-peers|--min-peers 2|min_peers|--elastic
elastic-lr|--elastic-lr|elastic_lr|--elastic
keep-global-batch|--keep-global-batch|keep_global_batch|--elastic
streams|--streams 2|streams|
transport|--transport shm|transport|"

# flag|arguments for one peer (rank 0, which saves the weights; TMP is
# $TMP). Each is changed on its own peer in one run, all at once.
SAME="gpu|--gpu 1
data-threads|--data-threads 2
checkpoint-dir|--checkpoint-dir TMP/unused
keep|--keep 5
save|--save TMP/same.st
metrics|--metrics TMP/m.jsonl
timeline|--timeline TMP/t.json
timeline-steps|--timeline-steps 2
log-every|--log-every 1
quiet|--quiet
profile-layers|--profile-layers TMP/p.csv
bind-to|--bind-to none
join-timeout|--join-timeout 30
peer-timeout|--peer-timeout 20"
cc_lists
case " $CC_ALLOWED " in
*" reno "*) SAME="$SAME
tcp-congestion|--tcp-congestion reno" ;;
*) UNTESTED_CC="tcp-congestion|reno is not allowed here ($CC_ALLOWED)" ;;
esac

UNTESTED="help|prints the help, trains nothing
summary|prints the layer table, trains nothing
hostfile|defines the mesh (its layout digest is in the fingerprint)
hosts|defines the mesh (its layout digest is in the fingerprint)
rank|defines the mesh: which peer this is
port|defines the mesh (its layout digest is in the fingerprint)
port-range|checks --port; defines no value of its own
secret-file|who may join: a wrong secret is refused (tests/mesh_secret.sh)
insecure|who may join: both sides must agree (tests/mesh_secret.sh)
job-id|who may join: another job is refused at the handshake
ib-dev|verbs only (not built or no RDMA port here): which local port
ib-port|verbs only (not built or no RDMA port here): which local port
gid-index|verbs only (not built or no RDMA port here): which local port
init|a file that fits is made by a run first: tests/train_finetune.sh has a peer with another file refused, naming init_digest
init-skip|needs --init (above); its field init_skip is in the fingerprint
eval-only|needs --init or --resume on every peer; its field eval_only is in the fingerprint
predict-out|needs --predict (above); rank 0 writes it
${UNTESTED_CC:-}"

names() { printf '%s\n' "$1" | sed -n 's/^\([a-z0-9-]*\)|.*/\1/p'; }

nref=$(names "$REFUSED" | wc -l)
t_plan $((nref + 2))

# 1. The lists cover --help, exactly.
"$MESHTRAIN" --help > "$TMP/help" 2>&1
grep -oE '^ +(-[A-Za-z], )?--[a-z0-9-]+' "$TMP/help" |
    sed 's/.*--//' | sort -u > "$TMP/flags"
{ names "$REFUSED"; names "$SAME"; names "$UNTESTED"; } | sort > "$TMP/listed"
missing=$(comm -23 "$TMP/flags" "$TMP/listed" | tr '\n' ' ')
stale=$(comm -13 "$TMP/flags" "$TMP/listed" | sort | uniq | tr '\n' ' ')
twice=$(uniq -d "$TMP/listed" | tr '\n' ' ')
[ -n "$(cat "$TMP/flags")" ] && [ -z "$missing$stale$twice" ]
t_ok $? "every --help flag ($(wc -l < "$TMP/flags")) is in exactly one list\
${missing:+; in none: $missing}${stale:+; not in --help: $stale}\
${twice:+; twice: $twice}"

# 2. Each REFUSED flag on rank 1 alone: rank 1, which dials rank 0, is
#    refused at once and exits 2 naming the field (rank 0 would wait for
#    it until --join-timeout: it is stopped instead).
printf '%s\n' "$REFUSED" > "$TMP/refused"
while IFS='|' read -r flag one field both; do
    one=$(printf '%s' "$one" | sed "s|TMP|$TMP|g")
    take_ports 2 || { t_ok 1 "$flag: free ports"; continue; }
    make_secret "$TMP/secret"
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 0 --port "$PORT" \
        --secret-file "$TMP/secret" $BASE $both > "$TMP/r.0.log" 2>&1
    p0=$BG_PID
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 1 --port "$PORT" \
        --secret-file "$TMP/secret" $BASE $both $one > "$TMP/r.1.log" 2>&1
    wait_exit "$BG_PID" 30
    code=$EXIT_CODE
    kill -TERM "$p0" 2>/dev/null
    wait_exit "$p0" 10
    ok=0
    [ "$code" -eq 2 ] || ok=1
    grep -q "configuration differs: $field=" "$TMP/r.1.log" || ok=1
    t_ok $ok "--$flag on one peer ($one): refused at the join naming \
\"$field\" (exit $code)"
    [ $ok -eq 0 ] || { t_show "$TMP/r.0.log" 4; t_show "$TMP/r.1.log" 4; }
done < "$TMP/refused"

# 3. The SAME flags, all changed on rank 0 (which saves) in one run and
#    on rank 1 in another: bitwise the weights of a uniform run, which
#    --verify-every also checks between the peers.
same_args=$(printf '%s\n' "$SAME" | sed 's/^[^|]*|//' | tr '\n' ' ' |
            sed "s|TMP|$TMP|g")
# run NAME ARGS0 -- ARGS1
run() {
    name=$1
    take_ports 2 || return 1
    make_secret "$TMP/secret"
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 0 --port "$PORT" \
        --secret-file "$TMP/secret" $BASE --verify-every 1 $2 \
        > "$TMP/$name.0.log" 2>&1
    PEERS=$BG_PID
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank 1 --port "$PORT" \
        --secret-file "$TMP/secret" $BASE --verify-every 1 $3 \
        > "$TMP/$name.1.log" 2>&1
    PEERS="$PEERS $BG_PID"
    wait_all 120
    [ "$CODES" = "0 0" ] || { t_show "$TMP/$name.0.log" 6;
                              t_show "$TMP/$name.1.log" 6; return 1; }
}
ok=0
run base "--save $TMP/base.st" "" || ok=1
codes_base=$CODES
# shellcheck disable=SC2086
run same0 "$same_args" "" || ok=1
codes0=$CODES
cmp -s "$TMP/base.st" "$TMP/same.st" || ok=1
rm -f "$TMP/same.st"
# shellcheck disable=SC2086
run same1 "--save $TMP/same.st" "$same_args" || ok=1
codes1=$CODES
cmp -s "$TMP/base.st" "$TMP/same.st" || ok=1
t_ok $ok "$(names "$SAME" | wc -l) flags changed on rank 0, then on rank 1: \
the weights of the uniform run (exit codes $codes_base, $codes0, $codes1)"
t_diag "changed: $same_args"
t_done
