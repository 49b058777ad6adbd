#!/usr/bin/python3
"""bench/train_report.py: summarise meshtrain --metrics and --timeline files.

  train_report.py LABEL METRICS.jsonl TIMELINE.json [SKIP]

Prints one CSV row: label, steps, mean step time, compute, exposed
communication and data wait (seconds per step, the first SKIP steps left
out, default 2), images/s, then from the timeline: the all-reduce time per
step (sparse gradients: their pairs' all-gathers), the part of it that
overlapped backward, and that fraction ("hidden").
"""
import json
import sys


def main(argv):
    label, mpath, tpath = argv[1], argv[2], argv[3]
    skip = int(argv[4]) if len(argv) > 4 else 2
    rows = [json.loads(l) for l in open(mpath)]
    rows = [r for r in rows if r["step"] > skip] or rows
    n = len(rows)

    def mean(k):
        return sum(r[k] for r in rows) / n

    ev = [e for e in json.load(open(tpath))["traceEvents"]
          if e.get("ph") == "X"]
    bwd = {}
    for e in ev:
        if e["name"] == "backward":
            bwd.setdefault(e["args"]["step"], []).append(
                (e["ts"], e["ts"] + e["dur"]))
    total = hidden = 0.0
    steps = set()
    for e in ev:
        # the dense buckets' all-reduces, and the sparse buckets'
        # all-gathers of (index, value) pairs (--compress topk, threshold)
        if not e["name"].startswith(("allreduce", "allgather sparse")):
            continue
        s = e["args"]["step"]
        if s < skip:
            continue
        steps.add(s)
        a, b = e["ts"], e["ts"] + e["dur"]
        total += b - a
        for (x, y) in bwd.get(s, []):
            hidden += max(0.0, min(b, y) - max(a, x))
    ns = max(len(steps), 1)
    frac = hidden / total if total > 0 else 0.0
    print("%s,%d,%.4f,%.4f,%.4f,%.4f,%.1f,%.4f,%.4f,%.3f" % (
        label, n, mean("t_step"), mean("t_compute"), mean("t_comm_exposed"),
        mean("t_data"), mean("images_per_s"), total / ns / 1e6,
        hidden / ns / 1e6, frac))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
