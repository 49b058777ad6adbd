#!/bin/sh
# tests/train_finetune.sh: --init FILE, --init-skip, --freeze and
# --eval-only in the trainer, with 2 peers (3 for the evaluation's
# sharding).
# - a model trained and saved by meshtrain starts another run; another
#   --num-classes re-initialises fc and says so by name; --init-skip keeps
#   tensors fresh;
# - a peer whose --init file holds other bytes is refused at the join,
#   naming init_digest; a file that does not fit the model is an error
#   that lists the tensors;
# - --freeze: the frozen tensors are bitwise unchanged after training,
#   every other one moved, the gradient buckets hold only the trained
#   floats, and the frozen BN keep their running statistics; a run with
#   layer2 frozen resumes bitwise;
# - --eval-only: top-1 and top-5 over the whole test split, every sample
#   once over 3 peers (the count), the same accuracy as 1 peer, and the
#   JSON record of --metrics; torchvision's resnet18 as PyTorch saved it;
# - --predict: the CSV of an image folder agrees with the evaluation of
#   the same files, and 3 peers write what 1 peer writes; peers whose
#   folders differ fail, as does bad input.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

[ -d "$FMNIST" ] || t_skip_all "no Fashion-MNIST in $FMNIST"
/usr/bin/python3 -c "import numpy" 2> /dev/null ||
    t_skip_all "no numpy for /usr/bin/python3"

t_plan 14
COMMON="$SMALL --data fashion-mnist --batch 16 --lr 0.05 --join-timeout 60"

# run NAME ARGS...: 2 peers by hand; 0 when both exit 0 (else the log)
run() {
    _name=$1
    shift
    # shellcheck disable=SC2086
    by_hand 2 "$TMP/$_name" $COMMON "$@"
    wait_all 300
    [ "$CODES" = "0 0" ] && return 0
    t_diag "$_name: exit $CODES"
    t_show "$TMP/${_name}0.log" 8
    t_show "$TMP/${_name}1.log" 8
    return 1
}

# the base model: 40 steps, saved by rank 0
run base --iters 40 --no-eval --save "$TMP/base.st"
t_ok $? "a base model trained by 2 peers and saved"

# another class count: fc re-initialised, named on rank 0
run classes --iters 4 --no-eval --init "$TMP/base.st" --num-classes 12 &&
    grep -q "re-initialised fc.weight: 10 classes in the file, 12 in the model" \
        "$TMP/classes0.log" &&
    grep -q "re-initialised fc.bias: 10 classes in the file, 12" \
        "$TMP/classes0.log" &&
    grep -q "started from $TMP/base.st" "$TMP/classes0.log"
t_ok $? "--init with --num-classes 12: fc re-initialised, said by name"

run skip --iters 4 --no-eval --init "$TMP/base.st" --init-skip fc \
    --save "$TMP/skip.st" &&
    grep -q "kept the fresh initialisation of 2 tensor(s) (--init-skip): fc.weight, fc.bias" \
        "$TMP/skip0.log"
t_ok $? "--init-skip fc: fc kept fresh, said"

# rank 1 holds other bytes: both refuse at the join, naming init_digest
take_ports 2
make_secret "$TMP/secret"
for r in 0 1; do
    f="$TMP/base.st"
    [ $r -eq 1 ] && f="$TMP/skip.st"
    # shellcheck disable=SC2086
    bg "$MESHTRAIN" -H localhost:2 --rank $r --port "$PORT" \
        --secret-file "$TMP/secret" $COMMON --iters 1 --no-eval \
        --init "$f" > "$TMP/digest$r.log" 2>&1
    eval "pd$r=\$BG_PID"
done
# shellcheck disable=SC2154
wait_exit "$pd0" 120
c0=$EXIT_CODE
# shellcheck disable=SC2154
wait_exit "$pd1" 120
c1=$EXIT_CODE
[ "$c0" -eq 2 ] && [ "$c1" -eq 2 ] &&
    grep -q "configuration differs.*init_digest=" "$TMP/digest0.log" &&
    grep -q "configuration differs.*init_digest=" "$TMP/digest1.log"
t_ok $? "a peer with another --init file: refused at the join naming init_digest (exit $c0 $c1)"
grep -h "cannot join" "$TMP/digest0.log" | sed 's/^/# /'

# --freeze: 2 peers fine-tune with the early layers fixed
run freeze --iters 6 --no-eval --init "$TMP/base.st" \
    --freeze conv1,bn1,layer1 --save "$TMP/freeze.st" \
    --timeline "$TMP/freeze.json" --timeline-steps 1 --quiet
t_ok $? "--freeze conv1,bn1,layer1: 2 peers fine-tune"
/usr/bin/python3 - "$TMP/base.st" "$TMP/freeze.st" "$TMP/freeze.json" \
    "$TMP/freeze0.log" > "$TMP/freeze.cmp" 2>&1 << 'PY'
import json, re, struct, sys
import numpy as np

def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    dt = {"F32": np.float32, "I64": np.int64}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:
                                 8 + n + v["data_offsets"][1]],
                             dtype=dt[v["dtype"]])
            for k, v in h.items()}

a, b = read(sys.argv[1]), read(sys.argv[2])
frozen = re.compile(r"^(conv1|bn1|layer1)\.")
bad = 0
nf = nt = 0
for k in a:
    if k.endswith("num_batches_tracked"):
        continue
    same = a[k].tobytes() == b[k].tobytes()
    if frozen.match(k):
        nf += 1
        if not same:
            print("frozen %s changed" % k)
            bad = 1
    elif not k.endswith("running_var") and not k.endswith("running_mean"):
        nt += 1
        if same:
            print("trained %s did not change" % k)
            bad = 1
print("%d frozen tensors (BN statistics included) bitwise unchanged, "
      "%d trained ones moved" % (nf, nt))
trained = sum(v.size for k, v in a.items() if not frozen.match(k) and
              "running" not in k and "num_batches" not in k)
ev = json.load(open(sys.argv[3]))["traceEvents"]
sent = sum(e["args"]["bytes"] for e in ev
           if e.get("name", "").startswith("allreduce bucket"))
log = open(sys.argv[4]).read()
m = re.search(r"buckets average (\d+) of the (\d+)", log)
print("step 1 all-reduced %d bytes: %d trained floats x 4 (log: %s)"
      % (sent, trained, m.group(0) if m else "none"))
if sent != 4 * trained or not m or int(m.group(1)) != trained:
    bad = 1
sys.exit(bad)
PY
t_ok $? "--freeze: frozen tensors and their BN statistics bitwise unchanged, the others moved; only the trained gradients all-reduced"
sed 's/^/# /' "$TMP/freeze.cmp"

# --freeze layer2 (after trained layers: backward through its frozen BN)
# from --init, resumed from a checkpoint: bitwise the uninterrupted run
RES="$SMALL --data fashion-mnist --batch 16 --iters 6 --no-eval \
--init $TMP/base.st --init-skip fc --freeze layer2"
# shellcheck disable=SC2086
"$MESHTRAIN" $RES --save "$TMP/full.st" > "$TMP/res1.log" 2>&1 &&
    "$MESHTRAIN" $RES --checkpoint-every 3 --checkpoint-dir "$TMP/ck" \
        > "$TMP/res2.log" 2>&1 &&
    rm -rf "$TMP/ck/rank-0/ckpt-000000006" &&
    "$MESHTRAIN" $RES --checkpoint-dir "$TMP/ck" --resume \
        --save "$TMP/resumed.st" > "$TMP/res3.log" 2>&1 &&
    grep -q "resumed from step 3" "$TMP/res3.log" &&
    cmp -s "$TMP/full.st" "$TMP/resumed.st"
t_ok $? "--freeze layer2 from --init, resumed at step 3: bitwise the uninterrupted run"

# --eval-only: 3 peers shard the test split (every sample once: 999
# samples, 333 each in batches of 100 and a partial one), 1 peer alone
# gets the same accuracy (synthetic data in the base model's shape: a
# tenth of Fashion-MNIST's evaluation time)
EV="$SMALL --data synthetic:4999 --in-channels 1 --num-classes 10 \
--batch 100 --join-timeout 60 --eval-only --init $TMP/base.st"
# shellcheck disable=SC2086
by_hand 3 "$TMP/eval" $EV --metrics "$TMP/eval.json"
wait_all 300
# shellcheck disable=SC2086
"$MESHTRAIN" $EV > "$TMP/eval1.txt" 2>&1
code=$?
line3=$(grep "^eval-only" "$TMP/eval0.log")
line1=$(grep "^eval-only" "$TMP/eval1.txt")
t_diag "3 peers: $line3"
t_diag "1 peer:  $line1"
/usr/bin/python3 - "$line3" "$line1" "$TMP/eval.json" << 'PY'
import json, re, sys
pat = (r"test accuracy of (\d+) samples over (\d+) peer\(s\): "
       r"top-1 ([\d.]+) % top-5 ([\d.]+) %")
a, b = re.search(pat, sys.argv[1]), re.search(pat, sys.argv[2])
rec = json.loads(open(sys.argv[3]).read())
ok = (a and b and a.group(1) == "999" and b.group(1) == "999" and
      a.group(2) == "3" and abs(float(a.group(3)) - float(b.group(3))) <= 0.05
      and abs(float(a.group(4)) - float(b.group(4))) <= 0.05 and
      rec["eval_only"] is True and rec["samples"] == 999 and
      abs(rec["top1"] - float(a.group(3))) < 0.01 and rec["peers"] == 3)
sys.exit(0 if ok else 1)
PY
t_ok $? "--eval-only: 999 test samples once over 3 peers, top-1 and top-5 as 1 peer's, JSON with --metrics (exit $CODES, $code)"

# torchvision's resnet18 as PyTorch saves it starts a run
if /usr/bin/python3 "$top_srcdir/tests/finetune_torch.py" "$TMP" \
    > "$TMP/torch.log" 2>&1; then
    # shellcheck disable=SC2086
    "$MESHTRAIN" --model resnet18 --threads 1 --data-threads 1 \
        --data synthetic:40 --image-size 32 --batch 8 --eval-only \
        --init "$TMP/tv18.st" > "$TMP/tv18.log" 2>&1 &&
        grep -q "^eval-only ($TMP/tv18.st): test accuracy of 8 samples" \
            "$TMP/tv18.log"
    t_ok $? "torchvision's resnet18 saved by PyTorch: --init, --eval-only"
    grep "eval-only" "$TMP/tv18.log" | sed 's/^/# /'
else
    t_skip "torchvision's resnet18: $(tail -1 "$TMP/torch.log")"
fi

# --predict: Fashion-MNIST test images as JPEG files in an imagefolder
# (6 per class in val/); evaluated as that data set and predicted from its
# val/ folder, the same files through the same transform: the CSV's
# top-1 and top-5 hits are the evaluation's, and 3 peers write what 1
# peer writes
/usr/bin/python3 - "$FMNIST" "$TMP/folder" << 'PY'
import gzip, os, sys
import numpy as np
from PIL import Image
src, root = sys.argv[1], sys.argv[2]
x = np.frombuffer(gzip.open(src + "/t10k-images-idx3-ubyte.gz").read()[16:],
                  dtype=np.uint8).reshape(-1, 28, 28)
y = np.frombuffer(gzip.open(src + "/t10k-labels-idx1-ubyte.gz").read()[8:],
                  dtype=np.uint8)
seen = {}
for i in range(len(y)):
    c = int(y[i])
    seen[c] = seen.get(c, 0) + 1
    if seen[c] > 7:
        continue
    split = "train" if seen[c] == 7 else "val"
    d = "%s/%s/%d" % (root, split, c)
    os.makedirs(d, exist_ok=True)
    Image.fromarray(x[i]).save("%s/t%05d.jpg" % (d, i), quality=95)
    if len(seen) == 10 and min(seen.values()) >= 7:
        break
PY
PRED="$SMALL --data imagefolder:$TMP/folder --in-channels 1 --batch 8 \
--eval-only --init $TMP/base.st --predict $TMP/folder/val"
# shellcheck disable=SC2086
by_hand 3 "$TMP/pred" $PRED --predict-out "$TMP/pred3.csv" --join-timeout 60
wait_all 300
codes3=$CODES
# shellcheck disable=SC2086
"$MESHTRAIN" $PRED --predict-out "$TMP/pred1.csv" > "$TMP/pred1.txt" 2>&1
code=$?
/usr/bin/python3 - "$TMP/pred0.log" "$TMP/pred3.csv" "$TMP/pred1.csv" \
    > "$TMP/pred.cmp" 2>&1 << 'PY'
import csv, re, sys
m = re.search(r"test accuracy of (\d+) samples over 3 peer\(s\): "
              r"top-1 ([\d.]+) % top-5 ([\d.]+) %", open(sys.argv[1]).read())
rows3 = list(csv.reader(open(sys.argv[2])))
rows1 = list(csv.reader(open(sys.argv[3])))
head, body = rows3[0], rows3[1:]
names = [r[0] for r in body]
hit1 = sum(r[0].split("/")[0] == r[1] for r in body)
hit5 = sum(r[0].split("/")[0] in r[1:11:2] for r in body)
n = len(body)
print("CSV: %d rows, top-1 %.2f %% top-5 %.2f %%; evaluation: %s" %
      (n, 100.0 * hit1 / n, 100.0 * hit5 / n, m.group(0) if m else "none"))
checks = {
    "60 rows, as the evaluation counts": m and int(m.group(1)) == n == 60,
    "the header": head == ["image"] + [x for j in range(1, 6) for x in
                                       ("top%d" % j, "p%d" % j)],
    "sorted, each image once": names == sorted(names) and
    len(set(names)) == n,
    "top-1 as the evaluation's": m and
    "%.2f" % (100.0 * hit1 / n) == m.group(2),
    "top-5 as the evaluation's": m and
    "%.2f" % (100.0 * hit5 / n) == m.group(3),
    "1 peer's classes": [[r[0]] + r[1:11:2] for r in rows1] ==
    [[r[0]] + r[1:11:2] for r in rows3],
    "5 distinct classes a row": all(len(set(r[1:11:2])) == 5 for r in body),
    "probabilities descending, sum <= 1": all(
        sorted(map(float, r[2:11:2]), reverse=True) ==
        list(map(float, r[2:11:2])) and
        sum(map(float, r[2:11:2])) <= 1.0001 for r in body),
}
for a, b in zip(rows1, rows3):
    if [a[0]] + a[1:11:2] != [b[0]] + b[1:11:2]:
        print("1 peer: %s\n3 peers: %s" % (",".join(a), ",".join(b)))
ok = True
for what, good in checks.items():
    if not good:
        print("wrong: " + what)
        ok = False
sys.exit(0 if ok else 1)
PY
t_ok $? "--predict: one CSV row per image, sorted, top-5 hits those of the evaluation, 3 peers as 1 (exit $codes3, $code)"
sed 's/^/# /' "$TMP/pred.cmp"
[ "$codes3" = "0 0 0" ] || t_show "$TMP/pred0.log" 5

# peers whose folders (the same path, each its own copy) name other
# files: every peer fails, naming the difference
mkdir "$TMP/a" "$TMP/b"
cp -r "$TMP/folder/val" "$TMP/a/img"
cp -r "$TMP/folder/val" "$TMP/b/img"
mv "$TMP/b/img/3" "$TMP/b/img/x3"
take_ports 2
make_secret "$TMP/secret"
for r in 0 1; do
    d="$TMP/a"
    [ $r -eq 1 ] && d="$TMP/b"
    # shellcheck disable=SC2086
    (cd "$d" && exec "$MESHTRAIN" -H localhost:2 --rank $r --port "$PORT" \
        --secret-file "$TMP/secret" $COMMON --iters 1 --no-eval \
        --predict img --predict-out "$TMP/other.csv") \
        > "$TMP/other$r.log" 2>&1 &
    eval "po$r=\$!"
done
# shellcheck disable=SC2154
wait "$po0"
o0=$?
# shellcheck disable=SC2154
wait "$po1"
o1=$?
[ $o0 -eq 1 ] && [ $o1 -eq 1 ] && [ ! -e "$TMP/other.csv" ] &&
    grep -q "rank 0 and rank 1 list 60 images under other names" \
        "$TMP/other0.log" &&
    grep -q "rank 0 and rank 1 list 60 images under other names" \
        "$TMP/other1.log"
t_ok $? "--predict: peers whose folders name other files both fail, no CSV (exit $o0 $o1)"

# bad --predict input: named, exit 1
# shellcheck disable=SC2086
"$MESHTRAIN" $SMALL --data fashion-mnist --eval-only --init "$TMP/base.st" \
    --predict "$TMP/none" > "$TMP/pbad1.log" 2>&1
c1=$?
# shellcheck disable=SC2086
"$MESHTRAIN" $SMALL --data fashion-mnist --eval-only --init "$TMP/base.st" \
    --predict "$TMP/folder/train/0/.." --predict-out "$TMP" \
    > "$TMP/pbad2.log" 2>&1
c2=$?
# shellcheck disable=SC2086
"$MESHTRAIN" $SMALL --data fashion-mnist --iters 1 \
    --predict-out "$TMP/x.csv" > "$TMP/pbad3.log" 2>&1
c3=$?
mkdir "$TMP/empty"
# shellcheck disable=SC2086
"$MESHTRAIN" $SMALL --data fashion-mnist --eval-only --init "$TMP/base.st" \
    --predict "$TMP/empty" > "$TMP/pbad4.log" 2>&1
c4=$?
[ $c1 -eq 1 ] && grep -q -- "--predict $TMP/none: No such file" "$TMP/pbad1.log" &&
    [ $c2 -eq 1 ] && grep -q -- "--predict-out $TMP is a directory" "$TMP/pbad2.log" &&
    [ $c3 -eq 1 ] && grep -q -- "--predict-out needs --predict" "$TMP/pbad3.log" &&
    [ $c4 -eq 1 ] && grep -q -- "no JPEG files" "$TMP/pbad4.log"
t_ok $? "bad --predict input: a missing or empty folder, a directory as output, --predict-out alone (exit $c1 $c2 $c3 $c4)"
cat "$TMP"/pbad?.log | grep -v "info:" | sed 's/^/# /'

# a file of another width: one error listing the tensors, exit 1
# shellcheck disable=SC2086
"$MESHTRAIN" $SMALL --width 8 --data fashion-mnist --iters 1 --no-eval \
    --init "$TMP/base.st" > "$TMP/misfit.log" 2>&1
code=$?
[ $code -eq 1 ] &&
    grep -q "does not fit resnet18: 0 tensor(s) missing, 0 unexpected, [1-9][0-9]* of another shape" \
        "$TMP/misfit.log" &&
    grep -q "layer4.1.conv2.weight: shape \[128,128,3,3\] in the file, \[64,64,3,3\] expected" \
        "$TMP/misfit.log"
t_ok $? "a file of another width: exit 1, every tensor listed (exit $code)"
grep -m 3 "does not fit\|conv1.weight" "$TMP/misfit.log" | sed 's/^/# /'

# a missing file: named
# shellcheck disable=SC2086
"$MESHTRAIN" $SMALL --data fashion-mnist --iters 1 --no-eval \
    --init "$TMP/nonexistent.st" > "$TMP/nofile.log" 2>&1
code=$?
[ $code -eq 1 ] && grep -q "init.*nonexistent.st" "$TMP/nofile.log"
t_ok $? "a missing --init file: exit 1, named (exit $code)"
sed 's/^/# /' "$TMP/nofile.log"
t_done
