#!/usr/bin/python3
"""report_collectives: the plot and the ratios of bench/collectives.sh.

usage: report_collectives.py COLLECTIVES.csv TCP_LIMIT.csv OUT.png

Prints, per setting and N, busbw (GB/s) of every system per size, the TCP
limit, and meshbench's best algorithm against the better of the two anchors
(Open MPI, Gloo) and against the TCP limit; then the 4 KiB all-reduce time
of every system. Draws busbw vs size, one panel per setting and N, one line
per system, the TCP limit dashed. Without matplotlib it prints and skips the
plot.
"""

import csv
import sys

ANCHORS = ("openmpi", "gloo")


def fnum(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def human(b):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return str(b)


def ratio(a, b):
    if a != a or b != b or b <= 0:
        return "-"
    return "%.2f" % (a / b)


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    rows = list(csv.DictReader(open(sys.argv[1])))
    # With --repeat, each measurement appears once per repetition: keep the
    # best (highest bandwidth, lowest time and RTT), which is the one least
    # disturbed by whatever else ran on the machine.
    limits = {}
    reps = 1
    for r in csv.DictReader(open(sys.argv[2])):
        key = (r["setting"], r["np"])
        reps = max(reps, int(fnum(r.get("rep")) if r.get("rep") else 1))
        best = limits.setdefault(key, dict(r))
        for k, v in r.items():
            old, new = fnum(best[k]), fnum(v)
            if new != new:
                continue
            if old != old or (k.endswith("GBps") and new > old) or \
                    (k == "ping_rtt_us" and new < old):
                best[k] = v
    data = {}   # (setting, np) -> system -> size -> row
    for r in rows:
        key = (r["setting"], r["np"])
        reps = max(reps, int(fnum(r.get("rep")) if r.get("rep") else 1))
        series = data.setdefault(key, {}).setdefault(r["system"], {})
        old = series.get(int(r["size"]))
        if old is None or fnum(r["busbw"]) > fnum(old["busbw"]):
            series[int(r["size"])] = r
    if reps > 1:
        print("best of %d repetitions per system and size" % reps)
    keys = list(dict.fromkeys([(r["setting"], r["np"]) for r in rows] +
                              list(limits)))
    keys.sort(key=lambda k: (k[0], int(k[1])))

    for key in keys:
        systems = data.get(key, {})
        lim = limits.get(key, {})
        limit = fnum(lim.get("limit_GBps"))
        names = sorted(systems, key=lambda s: (s not in ANCHORS, s))
        mesh = [s for s in names if s.startswith("meshbench")]
        sizes = sorted({sz for s in systems.values() for sz in s})
        print("\n== %s, N=%s: busbw GB/s (TCP limit %s GB/s per link; "
              "single stream %s; ping %s us)" % (
                  key[0], key[1], lim.get("limit_GBps", "-") or "-",
                  lim.get("single_GBps", "-") or "-",
                  lim.get("ping_rtt_us", "-") or "-"))
        head = "%8s" % "size" + "".join("%15s" % n for n in names)
        head += "%12s" % "anchor/lim" if not mesh else \
            "%12s%12s" % ("mesh/anchor", "mesh/limit")
        print(head)
        for sz in sizes:
            bus = {n: fnum(systems[n][sz]["busbw"]) if sz in systems[n]
                   else float("nan") for n in names}
            line = "%8s" % human(sz)
            line += "".join("%15.3f" % bus[n] for n in names)
            anchor = max([bus[n] for n in ANCHORS if bus.get(n) == bus.get(n)
                          and n in bus] or [float("nan")])
            if mesh:
                best = max([bus[n] for n in mesh if bus[n] == bus[n]] or
                           [float("nan")])
                line += "%12s%12s" % (ratio(best, anchor),
                                      ratio(best, limit))
            else:
                line += "%12s" % ratio(anchor, limit)
            print(line)
        if 4096 in sizes:
            print("   4 KiB all-reduce time (us): " + ", ".join(
                "%s %s" % (n, systems[n][4096]["time_us"])
                for n in names if 4096 in systems[n]))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found (apt-get install python3-matplotlib): "
              "no plot")
        return 0
    if not keys:
        return 0
    settings = list(dict.fromkeys(k[0] for k in keys))
    nps = sorted({int(k[1]) for k in keys})
    fig, axes = plt.subplots(len(settings), len(nps), squeeze=False,
                             figsize=(4.5 * len(nps), 3.6 * len(settings)))
    for i, st in enumerate(settings):
        for j, n in enumerate(nps):
            ax = axes[i][j]
            key = (st, str(n))
            for name, series in sorted(data.get(key, {}).items()):
                xs = sorted(series)
                ax.plot(xs, [fnum(series[x]["busbw"]) for x in xs],
                        marker="o", ms=3, label=name)
            limit = fnum(limits.get(key, {}).get("limit_GBps"))
            if limit == limit:
                ax.axhline(limit, ls="--", color="gray", label="TCP limit")
            ax.set_xscale("log", base=2)
            ax.set_title("%s, N=%d" % (st, n))
            ax.set_xlabel("bytes")
            ax.set_ylabel("busbw (GB/s)")
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    fig.suptitle("all-reduce float32 sum: busbw vs size")
    fig.tight_layout()
    fig.savefig(sys.argv[3], dpi=100)
    print("\nplot: %s" % sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
