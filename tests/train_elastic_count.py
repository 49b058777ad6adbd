#!/usr/bin/env python3
"""tests/train_elastic_count.py: the counting checks of tests/train_elastic.sh.

usage: train_elastic_count.py METRICS STEPS SAMPLES N GMAX SAMPLE_FILE...

METRICS is rank 0's --metrics file (the view records and one line per
step), STEPS the run's length, N the training samples, GMAX the largest
global batch (samples per step) of any view. Each SAMPLE_FILE is a peer's
MESHTRAIN_TEST_SAMPLES file: "view step epoch position count" per
micro-batch of each step it finished. A step run again in a later view
(after a roll-back) counts only with that view's lines.

Checks: the metrics name every step 1..STEPS exactly once, in order; every
step 0..STEPS-1 has trained samples; in every epoch each permutation
position is used at most once, and the positions used are exactly
[0, U): none skipped but the tail of fewer than GMAX at the end of an
epoch (as without failures), and the last epoch from 0 up to where the run
ended. Prints one line per failed check; exit 1 when any failed.
"""
import collections
import json
import sys


def main():
    metrics, steps, n, gmax = sys.argv[1], int(sys.argv[2]), \
        int(sys.argv[3]), int(sys.argv[4])
    bad = []
    seen = []
    views = 0
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") == "view":
                views += 1
            elif "event" not in rec:
                seen.append(rec["step"])
    if seen != list(range(1, steps + 1)):
        dup = [s for s, c in collections.Counter(seen).items() if c > 1]
        gap = sorted(set(range(1, steps + 1)) - set(seen))
        bad.append("metrics steps: %d lines; doubled %s; missing %s"
                   % (len(seen), dup[:10], gap[:10]))
    # per step, the lines of the latest view that ran it
    by_step = {}
    for path in sys.argv[5:]:
        with open(path) as f:
            for line in f:
                view, step, epoch, pos, count = map(int, line.split())
                cur = by_step.get(step)
                if cur is None or view > cur[0]:
                    by_step[step] = (view, [(epoch, pos, count)])
                elif view == cur[0]:
                    cur[1].append((epoch, pos, count))
    missing = sorted(set(range(steps)) - set(by_step))
    if missing:
        bad.append("steps with no samples: %s" % missing[:10])
    used = collections.Counter()
    for view, lines in by_step.values():
        for epoch, pos, count in lines:
            for p in range(pos, pos + count):
                used[(epoch, p)] += 1
    twice = [k for k, c in used.items() if c > 1]
    if twice:
        bad.append("%d positions used twice, e.g. %s" % (len(twice),
                                                         twice[:5]))
    epochs = sorted({e for e, _ in used})
    for e in epochs:
        pos = sorted(p for ee, p in used if ee == e)
        top = pos[-1] + 1
        if pos != list(range(top)):
            holes = sorted(set(range(top)) - set(pos))
            bad.append("epoch %d: positions skipped below %d: %s"
                       % (e, top, holes[:10]))
        if e != epochs[-1] and n - top >= gmax:
            bad.append("epoch %d ends at %d of %d (a whole step of %d left)"
                       % (e, top, n, gmax))
    print("# %d steps, %d view change(s), %d samples counted in %d epoch(s)"
          % (len(by_step), views, sum(used.values()), len(epochs)))
    for b in bad:
        print("# " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
