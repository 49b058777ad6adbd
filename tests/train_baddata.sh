#!/bin/sh
# tests/train_baddata.sh: bad data files stop meshtrain with a message that
# names the file and the byte offset (exit 1, a local error), and
# --on-bad-sample picks what happens to a corrupt JPEG: fail stops, skip
# trains on (with a warning naming the file). Nothing crashes.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 5
take_ports 1 || exit 99
port=$PORT
ONE="-H localhost:1 --port $port --insecure --join-timeout 20"

# A truncated Fashion-MNIST: the training images cut at 100000 bytes.
if [ -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
    mkdir -p "$TMP/fm"
    cp "$FMNIST"/*labels* "$FMNIST"/t10k-images* "$TMP/fm/"
    gzip -dc "$FMNIST/train-images-idx3-ubyte.gz" | head -c 100000 \
        > "$TMP/fm/train-images-idx3-ubyte"
    # shellcheck disable=SC2086
    "$MESHTRAIN" $ONE $SMALL --data "fashion-mnist:$TMP/fm" --iters 1 \
        > "$TMP/fm.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "train-images-idx3-ubyte" "$TMP/fm.log" &&
        grep -q "offset" "$TMP/fm.log"
    t_ok $? "truncated IDX file: exit 1 naming the file and offset (exit $rc)"
    grep meshtrain: "$TMP/fm.log" | head -n 1 | sed 's/^/# /'
else
    t_skip "no Fashion-MNIST in $FMNIST"
fi

# An image folder, 2 classes x 8 JPEGs, one of them corrupt.
if /usr/bin/python3 - "$TMP/if" <<'PY'
import os, random, sys
from PIL import Image
root = sys.argv[1]
random.seed(1)
for split, n in (("train", 8), ("val", 4)):
    for c in ("a", "b"):
        d = os.path.join(root, split, c)
        os.makedirs(d)
        for i in range(n):
            im = Image.new("RGB", (20, 20), (200 if c == "a" else 20, 90, 60))
            im.putpixel((random.randrange(20), random.randrange(20)),
                        (255, 255, 255))
            im.save(os.path.join(d, "%d.jpg" % i), quality=90)
bad = os.path.join(root, "train", "b", "3.jpg")
data = open(bad, "rb").read()
open(bad, "wb").write(data[:200] + b"\x00" * 50)
PY
then
    IF="$SMALL --data imagefolder:$TMP/if --image-size 16 --batch 4 --iters 4"
    # shellcheck disable=SC2086
    "$MESHTRAIN" $ONE $IF --on-bad-sample fail > "$TMP/fail.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "3.jpg" "$TMP/fail.log"
    t_ok $? "--on-bad-sample fail: exit 1 naming the JPEG (exit $rc)"
    grep meshtrain: "$TMP/fail.log" | head -n 1 | sed 's/^/# /'
    # shellcheck disable=SC2086
    "$MESHTRAIN" $ONE $IF --on-bad-sample skip > "$TMP/skip.log" 2>&1
    rc=$?
    t_ok $rc "--on-bad-sample skip: training goes on (exit $rc)"
    grep -q "3.jpg" "$TMP/skip.log"
    t_ok $? "--on-bad-sample skip: a warning names the skipped JPEG"
    grep "3.jpg" "$TMP/skip.log" | head -n 1 | sed 's/^/# /'
    [ $rc -eq 0 ] || t_show "$TMP/skip.log"
else
    t_skip "no PIL to write JPEGs"
    t_skip "no PIL to write JPEGs"
    t_skip "no PIL to write JPEGs"
fi

# A data directory that does not exist.
# shellcheck disable=SC2086
"$MESHTRAIN" $ONE $SMALL --data "cifar10:$TMP/none" --iters 1 \
    > "$TMP/none.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "$TMP/none" "$TMP/none.log"
t_ok $? "missing data directory: exit 1 naming it (exit $rc)"
t_done
