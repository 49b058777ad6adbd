#!/usr/bin/env python3
"""bench/join_pause.py METRICS JOINER_LOG [LABEL]: the pause a joiner's
admission added to the members (bench/catchup.sh, bench/join.sh).

From rank 0's --metrics: the median interval between step records (a
normal step), the interval across the view change that admitted the
joiner (its pause is that less a normal step; the records are written
as steps commit, so the interval holds the view change and the step
redone after it), the view change's own time (recovery_s), the whole
state's size and the bytes sent in the view change; from the joiner's
log: the step of its catch-up snapshot and its join time; and the
median step from that snapshot to the admission (the members served the
catch-up meanwhile). One line.
"""
import json
import re
import statistics
import sys


def main():
    recs = []
    for line in open(sys.argv[1]):
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    log = open(sys.argv[2]).read()
    label = sys.argv[3] if len(sys.argv) > 3 else ""
    steps = {r["step"]: r["wall"] for r in recs if "loss" in r and "wall" in r}
    view = [r for r in recs if r.get("event") == "view" and r.get("joined")]
    xfer = [r for r in recs if r.get("event") == "transfer"]
    if not view:
        print("%-8s the joiner was not admitted" % label)
        return
    s = view[-1]["step"]
    ks = sorted(steps)
    gaps = [steps[b] - steps[a] for a, b in zip(ks, ks[1:])
            if b == a + 1 and not (a <= s < b)]
    normal = statistics.median(gaps) if gaps else float("nan")
    gap = (steps[s + 1] - steps[s] if s in steps and s + 1 in steps
           else float("nan"))
    got = re.search(r"state (\d+) bytes received", log)
    cu = re.search(r"a snapshot of step (\d+) ", log)
    # while the joiner caught up: the steps from its snapshot to the
    # admission (the members also sent it the snapshot and the gradients)
    during = [steps[b] - steps[a] for a, b in zip(ks, ks[1:])
              if b == a + 1 and cu and int(cu.group(1)) <= a and b <= s]
    jt = re.search(r"done ([0-9.]+) s after start", log)
    print("%-8s %7.3f %8s %8.3f %8.3f %8.3f %10s %10s %8s %8s %7s" % (
        label, normal,
        "%.3f" % statistics.median(during) if during else "-",
        gap, gap - normal, view[-1]["recovery_s"],
        got.group(1) if got else "-",
        xfer[-1]["state_bytes"] if xfer else "-",
        cu.group(1) if cu else "-", s, jt.group(1) if jt else "-"))


if __name__ == "__main__":
    main()
