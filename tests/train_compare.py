#!/usr/bin/python3
"""tests/train_compare.py: compare meshtrain outputs for the scenario tests.

  train_compare.py weights A.safetensors B.safetensors RTOL
      Every parameter (BN running statistics and counters left out), as
      one vector: |a - b| <= RTOL |a| (Euclidean norms). Also prints the
      largest element difference and its tensor.
  train_compare.py loss A.jsonl B.jsonl RTOL
      The per-step losses of two --metrics files, step by step:
      |a - b| <= RTOL * |a| at every step, and the same step numbers.
  train_compare.py top1 LOG MIN
      The "test accuracy ... top-1 X %" line of LOG has X >= MIN.

Exit status 0 when the comparison holds, 1 when not, 2 on bad input.
"""
import json
import re
import struct
import sys

import numpy as np


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(t["shape"])
    return out


def weights(a_path, b_path, rtol):
    a, b = read_st(a_path), read_st(b_path)
    if sorted(a) != sorted(b):
        print("# tensor names differ")
        return 1
    worst, where, d2, n2 = 0.0, "", 0.0, 0.0
    for name in a:
        if "running_" in name or "num_batches" in name:
            continue
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        d2 += ((x - y) ** 2).sum()
        n2 += (x ** 2).sum()
        diff = np.abs(x - y).max()
        if diff > worst:
            worst, where = diff, name
    rel = (d2 / max(n2, 1e-30)) ** 0.5
    print("# weights: |a - b| / |a| = %.3g over the model (tolerance %g); "
          "largest element difference %.3g (%s)" % (rel, rtol, worst,
                                                   where or "-"))
    return 0 if rel <= rtol else 1


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            out[o["step"]] = o["loss"]
    return out


def loss(a_path, b_path, rtol):
    a, b = losses(a_path), losses(b_path)
    if sorted(a) != sorted(b) or not a:
        print("# the metrics files have different steps: %s vs %s"
              % (sorted(a), sorted(b)))
        return 1
    worst = 0.0
    for s in sorted(a):
        rel = abs(a[s] - b[s]) / max(abs(a[s]), 1e-12)
        print("# step %d: loss %.7f vs %.7f" % (s, a[s], b[s]))
        worst = max(worst, rel)
    print("# largest relative loss difference %.3g, tolerance %g"
          % (worst, rtol))
    return 0 if worst <= rtol else 1


def top1(path, minimum):
    with open(path, errors="replace") as f:
        m = re.findall(r"test accuracy.*top-1 ([0-9.]+) %", f.read())
    if not m:
        print("# no test accuracy line in %s" % path)
        return 1
    print("# test top-1 %s %%, required %g %%" % (m[-1], minimum))
    return 0 if float(m[-1]) >= minimum else 1


def main(argv):
    if len(argv) == 4 and argv[1] == "top1":
        return top1(argv[2], float(argv[3]))
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    mode, a, b, tol = argv[1], argv[2], argv[3], float(argv[4])
    if mode == "weights":
        return weights(a, b, tol)
    if mode == "loss":
        return loss(a, b, tol)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
