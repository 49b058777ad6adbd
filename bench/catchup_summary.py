#!/usr/bin/env python3
"""bench/catchup_summary.py DIR PEERS: bench/catchup.sh's summary over
its runs.

Reads DIR/summary.txt (one line per run from bench/join_pause.py, the
run's name first: c1, w1, c2, ...; c: with the catch-up, w: without;
bc, bw: the same with --base's binary),
DIR/NAME.load (the load averages at the run's start and end) and the
view change's stages that rank 0 (DIR/NAME.p0.log) and the joiner
(DIR/NAME.pPEERS.log) logged ("the change to view E, s: ..."). Prints,
per mode, the median and the range over its runs of the members' pause,
the view change's own time, and each stage of it on rank 0 and on the
joiner, with the fraction of rank 0's view change that each stage is.
"""
import re
import statistics
import sys

STAGES = ["agreement", "restore", "weights' SHA-256", "mesh", "transfer",
          "BN average", "copy", "SHA-256", "the rest", "restore2", "setup",
          "weight check", "total"]


def stages(path):
    """The last stage line of a log: {stage: seconds}, and bytes hashed."""
    try:
        text = open(path).read()
    except OSError:
        return None, None
    lines = [l for l in text.splitlines() if "the change to view" in l]
    if not lines:
        return None, None
    line = lines[-1]
    nums = [float(x) for x in
            re.findall(r"(?<![\w-])([0-9]+\.[0-9]+)", line.split("; SHA")[0])]
    # the second "restore" is the one after the transfer
    if len(nums) != len(STAGES):
        return None, None
    hashed = re.search(r"SHA-256 over ([0-9]+) bytes of a ([0-9]+)", line)
    return dict(zip(STAGES, nums)), hashed.groups() if hashed else None


def spread(xs):
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    return "%.3f (%.3f-%.3f, n=%d)" % (statistics.median(xs), min(xs),
                                       max(xs), len(xs))


def main():
    out, peers = sys.argv[1], sys.argv[2]
    runs = {}
    for line in open(out + "/summary.txt"):
        f = line.split()
        m = re.match(r"^([a-z]+)[0-9]+$", f[0]) if f else None
        if not m or len(f) < 11:
            continue
        try:
            pause, view = float(f[4]), float(f[5])
        except ValueError:
            continue
        runs.setdefault(m.group(1), []).append((f[0], pause, view))
    names = {"c": "with the catch-up", "w": "whole state in the view change",
             "bc": "--base, with the catch-up",
             "bw": "--base, whole state in the view change"}
    for mode, rs in sorted(runs.items()):
        print("%s (%s):" % (names.get(mode, mode), " ".join(r[0] for r in rs)))
        print("  members' pause  %s s" % spread([r[1] for r in rs]))
        print("  view change     %s s" % spread([r[2] for r in rs]))
        loads = []
        for r in rs:
            try:
                loads.append(open("%s/%s.load" % (out, r[0])).read().strip())
            except OSError:
                pass
        if loads:
            print("  load (start end): %s" % "; ".join(loads))
        for who, log in (("rank 0", "p0"), ("joiner", "p" + peers)):
            got = [stages("%s/%s.%s.log" % (out, r[0], log)) for r in rs]
            st = [g[0] for g in got if g[0]]
            if not st:
                print("  %s: no stage line" % who)
                continue
            tot = statistics.median([s["total"] for s in st])
            print("  %s's view change, median s (fraction of its total):"
                  % who)
            for k in STAGES:
                m = statistics.median([s[k] for s in st])
                print("    %-17s %s%s" % (
                    k, spread([s[k] for s in st]),
                    "  %4.1f %%" % (100 * m / tot) if tot > 0 and
                    k != "total" else ""))
            hs = ["%s of %s" % g[1] for g in got if g[1]]
            print("    SHA-256 over (bytes): %s" % "; ".join(hs))


if __name__ == "__main__":
    main()
