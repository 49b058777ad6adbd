#!/usr/bin/python3
"""report_collectives: the plot and the ratios of bench/collectives.sh.

usage: report_collectives.py COLLECTIVES.csv TCP_LIMIT.csv OUT.png [CPU.csv]

Prints, per setting and N, busbw (GB/s) of every system per size, the TCP
limit, and meshbench's best algorithm against the better of the two anchors
(Open MPI, Gloo) and against the TCP limit; then the 4 KiB all-reduce time
of every system; with CPU.csv (collectives.sh's cpu.csv), the machine's
CPU use while each system ran: busy and user-space percent of the time the
hypervisor left it (medians), and the steal, with a warning for every run
the hypervisor took more than STEAL_WARN percent of (a half-second spike
now and then is common and only touches a size or two; a few percent over
a whole run disturbs its numbers). Draws busbw vs size, one panel per
setting and N, one line per system, the TCP limit dashed. Without
matplotlib it prints and skips the plot. After the tables it says whether
meshbench met each of the collectives issue's goals (goals_lines).
"""

import csv
import re
import sys

ANCHORS = ("openmpi", "openmpi-vader", "gloo")
AUTO_SLACK = 0.03                            # auto vs the best fixed one
STEAL_WARN = 2.0
MiB = 1 << 20
# The collectives issue's goals for meshbench's best algorithm per size.
LIMIT_SHARE, LIMIT_FROM = 0.90, 16 * MiB     # of the setting's TCP limit
ANCHOR_FROM = 1 * MiB                        # never below the better anchor
LINE_SHARE, LINE_FROM = 0.97, 16 * MiB       # of a shaped setting's rate
FALL_MAX, FALL_FROM, FALL_TO = 0.05, 16 * MiB, 1024 * MiB
LAT_SIZE, LAT_US = 4096, {2: 150.0, 8: 600.0}
# tc's rate units, in bits per second
TC_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


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


def median(v):
    v = sorted(x for x in v if x == x)
    if not v:
        return float("nan")
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def line_rate(setting):
    """A shaped setting's rate in GB/s from its name (collectives.sh calls
    setting c "netns-RATE[-mtuM]", RATE in tc's units, e.g. 1gbit), or
    None for an unshaped one."""
    m = re.match(r"netns-([0-9]+(?:\.[0-9]+)?)([kmgt]?)bit(?:-|$)", setting)
    if not m:
        return None
    return float(m.group(1)) * TC_UNITS[m.group(2)] / 8e9


def verdict(ok):
    return "MET" if ok else "MISSED"


def worst_share(best, sizes, lo, hi, ref):
    """(worst best[sz] / ref over sizes lo..hi, its size), or None."""
    if not ref > 0:  # no reference (nan) or a zero one
        return None
    pts = [(best[sz] / ref, sz) for sz in sizes
           if lo <= sz <= hi and best.get(sz) == best.get(sz)]
    return min(pts) if pts else None


def goals_lines(setting, np, best, anchor, limit, lat_us, auto=None):
    """The goals' verdicts for one setting and N, one line each.

    best and anchor map size -> busbw (GB/s) of meshbench's best algorithm
    and of the better anchor; limit is the TCP limit (GB/s per link);
    lat_us is meshbench's best 4 KiB time. A goal whose sizes were not
    measured says so instead of a verdict."""
    out = []
    # a size another system ran but meshbench did not (nan) is no point
    sizes = sorted(sz for sz in best if best[sz] == best[sz])
    top = human(sizes[-1]) if sizes else "-"

    w = worst_share(best, sizes, LIMIT_FROM, float("inf"), limit)
    name = "busbw >= %d %% of the TCP limit from %s" % (
        round(LIMIT_SHARE * 100), human(LIMIT_FROM))
    out.append("%s: %s" % (name, "not measured" if w is None else
                           "%s (worst %.2f at %s)" % (
                               verdict(w[0] >= LIMIT_SHARE), w[0],
                               human(w[1]))))

    pts = [(best[sz] / anchor[sz], sz) for sz in sizes
           if sz >= ANCHOR_FROM and best[sz] == best[sz]
           and anchor.get(sz, float("nan")) > 0]
    name = "never below the better anchor from %s" % human(ANCHOR_FROM)
    out.append("%s: %s" % (name, "not measured" if not pts else
                           "%s (worst %.2f at %s)" % (
                               verdict(min(pts)[0] >= 1.0), min(pts)[0],
                               human(min(pts)[1]))))

    rate = line_rate(setting)
    if rate is not None:
        w = worst_share(best, sizes, LINE_FROM, float("inf"), rate)
        name = "busbw >= %d %% of the shaped line rate (%.4g GB/s) from " \
            "%s" % (round(LINE_SHARE * 100), rate, human(LINE_FROM))
        out.append("%s: %s" % (name, "not measured" if w is None else
                               "%s (worst %.2f at %s)" % (
                                   verdict(w[0] >= LINE_SHARE), w[0],
                                   human(w[1]))))

    name = "busbw falls <= %d %% from %s to %s" % (
        round(FALL_MAX * 100), human(FALL_FROM), human(FALL_TO))
    base = best.get(FALL_FROM, float("nan"))
    w = worst_share(best, sizes, FALL_FROM + 1, FALL_TO, base)
    if w is None:
        out.append("%s: not measured (needs %s and a larger size)" % (
            name, human(FALL_FROM)))
    else:
        fall = 1.0 - w[0]
        out.append("%s: %s (%+.0f %% at %s%s)" % (
            name, verdict(fall <= FALL_MAX), -fall * 100, human(w[1]),
            "" if sizes[-1] >= FALL_TO else
            "; measured up to %s only" % top))

    if auto:
        pts = [(auto[sz] / best[sz], sz) for sz in sizes
               if auto.get(sz, float("nan")) == auto.get(sz) and best[sz] > 0]
        name = "auto within %d %% of the best fixed algorithm" % round(
            AUTO_SLACK * 100)
        out.append("%s: %s" % (name, "not measured" if not pts else
                               "%s (worst %.2f at %s)" % (
                                   verdict(min(pts)[0] >= 1 - AUTO_SLACK),
                                   min(pts)[0], human(min(pts)[1]))))

    if np in LAT_US:
        name = "a %s all-reduce takes <= %.0f us" % (human(LAT_SIZE),
                                                     LAT_US[np])
        out.append("%s: %s" % (name, "not measured" if lat_us != lat_us else
                               "%s (%.0f us)" % (
                                   verdict(lat_us <= LAT_US[np]), lat_us)))
    return out


def report_cpu(by_system):
    """One line per setting and N: each system's CPU use (median over its
    runs and repetitions), then a warning for every run the hypervisor
    disturbed: steal over the run above STEAL_WARN percent."""
    if not by_system:
        return
    names = sorted(by_system, key=lambda s: (s != "tcp-limit",
                                             s not in ANCHORS, s))
    parts = []
    for n in names:
        rs = by_system[n]
        busy = median([fnum(r["busy_pct"]) for r in rs])
        user = median([fnum(r["user_pct"]) for r in rs])
        steal = max([fnum(r["steal_pct"]) for r in rs] or [float("nan")])
        parts.append("%s %s/%s st %s" % (
            n, "-" if busy != busy else "%.0f" % busy,
            "-" if user != user else "%.0f" % user,
            "-" if steal != steal else "%.1f" % steal))
    print("   CPU % busy/user, % stolen: " + "; ".join(parts))
    for n in names:
        for r in by_system[n]:
            steal = fnum(r["steal_pct"])
            if steal == steal and steal > STEAL_WARN:
                print("   ! %s%s (repetition %s): the hypervisor took %.1f %% "
                      "of the CPU over the run (up to %.0f %% of a half "
                      "second): that run is disturbed" % (
                          n, " " + r["sizes"] if r.get("sizes") else "",
                          r.get("rep") or "1", steal,
                          fnum(r["steal_max_pct"])))


def main():
    if len(sys.argv) not in (4, 5):
        sys.stderr.write(__doc__)
        return 2
    cpu = {}    # (setting, np) -> system -> [row, ...]
    if len(sys.argv) == 5:
        for r in csv.DictReader(open(sys.argv[4])):
            cpu.setdefault((r["setting"], r["np"]), {}).setdefault(
                r["system"], []).append(r)
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

    goals = []  # (key, lines)
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
        best_of, anchor_of, auto_of = {}, {}, {}
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
                best_of[sz], anchor_of[sz] = best, anchor
                if "meshbench-auto" in bus:
                    auto_of[sz] = bus["meshbench-auto"]
                line += "%12s%12s" % (ratio(best, anchor),
                                      ratio(best, limit))
            else:
                line += "%12s" % ratio(anchor, limit)
            print(line)
        if 4096 in sizes:
            print("   4 KiB all-reduce time (us): " + ", ".join(
                "%s %s" % (n, systems[n][4096]["time_us"])
                for n in names if 4096 in systems[n]))
        report_cpu(cpu.get(key, {}))
        if mesh:
            lat = min([fnum(systems[n][LAT_SIZE]["time_us"]) for n in mesh
                       if LAT_SIZE in systems[n]] or [float("nan")])
            goals.append((key, goals_lines(key[0], int(key[1]), best_of,
                                           anchor_of, limit, lat, auto_of)))

    if goals:
        print("\n== goals: meshbench's best algorithm per size")
        counts = {"MET": 0, "MISSED": 0}
        for key, lines in goals:
            print("%s, N=%s:" % key)
            for ln in lines:
                print("   " + ln)
                for v in counts:
                    if ": %s (" % v in ln:
                        counts[v] += 1
        print("%d met, %d missed" % (counts["MET"], counts["MISSED"]))

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
