#!/usr/bin/python3
"""bench/scaling_plot.py: the table and figure of bench/scaling.

Reads the raw points of a bench/scaling run (DIR/raw/SERIES-N/: meta,
metrics.jsonl of rank 0, rankR.out of every rank), decides which points
are valid, writes the CSV and draws the figure in the seed's style:
throughput bars on a log axis, communication-cost lines on a second axis,
SINGA's values (read from the seed's figure) beside ours.

A point is invalid (this machine, not the simulated network, limits it)
when any of these holds:
  - the worst rank's median compute stretch > STRETCH_MS: its simulated
    forward + backward took that much longer than the profile says,
    because the peers are not scheduled on time (the CPU is saturated);
  - the CPU demand of the peers (CPU seconds per step, summed over the
    ranks, over t_iter x cores) > CPU_DEMAND;
  - the same CPU seconds over the part of the step where the peers
    communicate (t_iter minus the forward pass, when the network is idle)
    x cores > COMM_CPU_DEMAND: the all-reduces then wait for a core at
    every hop, and the latency terms are this machine's run queue;
  - the run failed or did not record enough steps.
The whole machine's busy fraction during the run (/proc/stat, our peers
and anything else) is reported beside it: other load slows the peers'
network processing too, so a point taken on a busy machine overstates
the communication cost (an upper bound) even when it is valid.
"""
import argparse
import csv
import json
import os
import re
import statistics
import sys

STRETCH_MS = 2.0
CPU_DEMAND = 0.85
COMM_CPU_DEMAND = 0.8
SERIES = ["ring", "auto", "tree", "hier", "ps"]
LABEL = {"ring": "meshtrain ring", "auto": "meshtrain auto",
         "tree": "meshtrain tree", "hier": "meshtrain hier",
         "ps": "parameter server (--algo ps)"}
COLOR = {"ring": "#1f77b4", "auto": "#2ca02c", "tree": "#9467bd",
         "hier": "#ff7f0e", "ps": "#d62728"}
# one peer per NIC beside the seed's topology: the same hues, lighter
LIGHT = {"ring": "#9ecae1", "auto": "#a1d99b", "tree": "#cbb6e3",
         "hier": "#fdd0a2", "ps": "#fcae91"}


def skey(series, pph, gpp):
    """A series with its topology: "hier@8x4" is series hier with 8 GPUs
    per host and 4 per process; one peer per host and per process is the
    series' plain name."""
    return series if pph == 1 and gpp == 1 else "%s@%dx%d" % (series, pph,
                                                              gpp)


def split_key(sk):
    if "@" not in sk:
        return sk, 1, 1
    base, topo = sk.split("@")
    pph, gpp = topo.split("x")
    return base, int(pph), int(gpp)


def order(sk):
    base, pph, gpp = split_key(sk)
    return (0 if pph > 1 else 1, SERIES.index(base), -gpp)


def label(sk, mixed):
    base, pph, gpp = split_key(sk)
    if pph == 1 and gpp == 1:
        return LABEL[base] + (", one peer per NIC" if mixed else "")
    return LABEL[base] + ", %d per host/NIC%s" % (
        pph, ", %d per process" % gpp if gpp > 1 else "")


def color(sk, mixed):
    base, pph, _ = split_key(sk)
    return LIGHT[base] if mixed and pph == 1 else COLOR[base]

SIM_RE = re.compile(r"rank (\d+): simulate: (\d+) steps, compute stretch "
                    r"median ([0-9.]+) ms, wait lateness median ([0-9.]+) "
                    r"ms max ([0-9.]+) ms, cpu ([0-9.]+) ms/step")


def read_meta(path):
    meta = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                key, val = line.rstrip("\n").split("=", 1)
                meta[key] = val
    return meta


def read_point(d):
    meta = read_meta(os.path.join(d, "meta"))
    n = int(meta["peers"])
    warmup = int(meta["warmup"])
    pph = int(meta.get("peers_per_host", "1"))
    gpp = int(meta.get("gpus_per_process", "1"))
    nproc = int(meta.get("processes", str(n)))
    p = {"series": meta["series"], "peers": n, "k": meta["k"],
         "rate": meta["rate"], "profile": meta["profile"],
         "pph": pph, "gpp": gpp, "processes": nproc,
         "nice": meta.get("nice", "0"), "rt": meta.get("rt", "0"),
         "spin": meta.get("shm_spin_us", ""),
         "key": skey(meta["series"], pph, gpp),
         "rc": int(meta["rc"]), "t_iter": None, "reasons": []}
    steps = []
    try:
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if m.get("step", 0) > warmup:
                    steps.append(float(m["t_step"]))
    except OSError:
        pass
    p["steps"] = len(steps)
    if steps:
        steps.sort()
        p["t_iter"] = statistics.median(steps)
        p["t_min"] = steps[0]
        p["t_max"] = steps[-1]
    stretch, lates, cpu, ranks = [], [], 0.0, 0
    for r in range(nproc):
        try:
            with open(os.path.join(d, "rank%d.out" % r)) as f:
                for line in f:
                    mt = SIM_RE.search(line)
                    if mt:
                        stretch.append(float(mt.group(3)))
                        lates.append(float(mt.group(4)))
                        cpu += float(mt.group(6)) / 1000
                        ranks += 1
        except OSError:
            pass
    timeline(p, d, warmup, meta)
    p["late_ms"] = max(lates) if lates else None
    p["stretch_ms"] = max(stretch) if stretch else None
    cores = int(meta.get("cores", "1"))
    p["cpu_demand"] = (cpu / (p["t_iter"] * cores)
                       if p["t_iter"] and ranks else None)
    win = (p["t_iter"] - p["forward_s"]
           if p["t_iter"] and p["forward_s"] else None)
    p["comm_cpu_demand"] = (cpu / (win * cores)
                            if win and win > 0 and ranks and n > 1 else None)
    tot = int(meta.get("total_jiffies", "0"))
    p["machine_busy"] = (int(meta.get("busy_jiffies", "0")) / tot
                         if tot > 0 else None)
    p["loadavg"] = meta.get("loadavg", "")
    if p["rc"] != 0:
        p["reasons"].append("run failed (rc %d)" % p["rc"])
    if not steps:
        p["reasons"].append("no steps after the warmup")
    if ranks < nproc:
        p["reasons"].append("%d of %d ranks reported" % (ranks, nproc))
    if p["stretch_ms"] is not None and p["stretch_ms"] > STRETCH_MS:
        p["reasons"].append("simulated compute %.1f ms longer than profiled "
                            "(median, worst rank)" % p["stretch_ms"])
    if p["cpu_demand"] is not None and p["cpu_demand"] > CPU_DEMAND:
        p["reasons"].append("peers need %.0f %% of the cores"
                            % (100 * p["cpu_demand"]))
    if (p["comm_cpu_demand"] is not None and
            p["comm_cpu_demand"] > COMM_CPU_DEMAND):
        p["reasons"].append("peers need %.0f %% of the cores while they "
                            "communicate" % (100 * p["comm_cpu_demand"]))
    p["valid"] = not p["reasons"]
    return p


def rate_bytes_per_s(rate):
    """tc's rate string ("156250kbit") in bytes per second."""
    m = re.match(r"([0-9.]+)([kmg]?)bit$", rate)
    if not m:
        return None
    mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return float(m.group(1)) * mult / 8


def timeline(p, d, warmup, meta):
    """From rank 0's timeline: the median time of the first bucket (the
    smallest: its all-reduce is latency alone) and of the last bucket (the
    one left when backward ends: it is most of the communication cost),
    with the last bucket's ring bandwidth term 2 (N-1)/N bytes / rate."""
    p["first_bucket_ms"] = p["last_bucket_ms"] = p["last_bw_ms"] = None
    p["forward_s"] = None
    try:
        with open(os.path.join(d, "timeline.json")) as f:
            ev = json.load(f)
    except (OSError, ValueError):
        return
    ev = ev.get("traceEvents", []) if isinstance(ev, dict) else ev
    first, last, fwd, nbytes = [], [], [], None
    nb = max([e.get("args", {}).get("bucket", -1) for e in ev] + [-1])
    for e in ev:
        a = e.get("args", {})
        if a.get("step", 0) > warmup and e.get("name") == "forward":
            fwd.append(e["dur"] / 1e6)
        if a.get("step", 0) <= warmup or "bucket" not in a:
            continue
        if a["bucket"] == 0:
            first.append(e["dur"] / 1000)
        if a["bucket"] == nb:
            last.append(e["dur"] / 1000)
            nbytes = a.get("bytes")
    n = p["peers"]
    bps = rate_bytes_per_s(meta.get("rate", ""))
    if fwd:
        p["forward_s"] = statistics.median(fwd)
    if first:
        p["first_bucket_ms"] = statistics.median(first)
    if last:
        p["last_bucket_ms"] = statistics.median(last)
    if nbytes and bps and n > 1:
        p["last_bw_ms"] = 2 * (n - 1) / n * nbytes / bps * 1000


def read_latency(raw, n):
    """The 4-byte ring all-reduce time (ms) of bench/scaling's probe."""
    try:
        with open(os.path.join(raw, "latency-%d" % n, "time_us")) as f:
            return float(f.read().split()[0]) / 1000
    except (OSError, ValueError, IndexError):
        return None


def load(raw):
    pts = {}
    for name in sorted(os.listdir(raw)):
        d = os.path.join(raw, name)
        if os.path.isfile(os.path.join(d, "meta")):
            p = read_point(d)
            p["latency_ms"] = read_latency(raw, p["peers"])
            pts[(p["key"], p["peers"])] = p
    return pts


def load_csv(path, only):
    """The points of an earlier run's CSV (another topology, say), kept as
    they were measured: drawn beside this run's and copied into its CSV;
    only the series named in only, when given."""
    pts = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if only and r["series"] not in only:
                continue
            pph = int(r.get("peers_per_host") or 1)
            gpp = int(r.get("gpus_per_process") or 1)
            r["peers_per_host"], r["gpus_per_process"] = pph, gpp
            r["processes"] = r.get("processes") or int(r["peers"]) // gpp
            k = skey(r["series"], pph, gpp)
            pts[(k, int(r["peers"]))] = {
                "key": k, "series": r["series"], "peers": int(r["peers"]),
                "t_iter": float(r["t_iter_s"]) if r["t_iter_s"] else None,
                "valid": r["valid"] == "1", "profile": r["profile"],
                "k": r["k"], "rate": r["tbf_rate"], "row": r}
    return pts


def read_seed(path):
    rows = []
    with open(path) as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    for r in csv.DictReader(lines):
        rows.append({k: float(v) for k, v in r.items()})
    return rows


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def table(pts, seed, path):
    seedn = {int(r["N"]): r for r in seed}
    rows = []
    for (s, n), p in sorted(pts.items(),
                            key=lambda x: (order(x[0][0]), x[0][1])):
        if "row" in p:
            rows.append(p["row"])
            continue
        base = pts.get((s, 1))
        t1 = base["t_iter"] if base else None
        tn = p["t_iter"]
        sr = seedn.get(n)
        rows.append({
            "series": p["series"], "peers": n, "peers_per_host": p["pph"],
            "gpus_per_process": p["gpp"], "processes": p["processes"],
            "k": p["k"], "tbf_rate": p["rate"],
            "profile": p["profile"], "steps": p["steps"],
            "t_iter_s": fmt(tn, ".4f"),
            "t_iter_min_s": fmt(p.get("t_min"), ".4f"),
            "t_iter_max_s": fmt(p.get("t_max"), ".4f"),
            "img_per_s": fmt(32 * n / tn if tn else None, ".1f"),
            "comm_ms": fmt((tn - t1) * 1000 if tn and t1 else None, ".1f"),
            "efficiency": fmt(t1 / tn if tn and t1 else None, ".3f"),
            "singa_comm_ms": fmt(sr["singa_derived_comm_ms"] if sr else None,
                                 ".0f"),
            "singa_eff": fmt(sr["singa_eff"] if sr else None, ".2f"),
            "first_bucket_ms": fmt(p["first_bucket_ms"], ".1f"),
            "last_bucket_ms": fmt(p["last_bucket_ms"], ".1f"),
            "last_bucket_ring_bw_ms": fmt(p["last_bw_ms"], ".1f"),
            "stretch_ms": fmt(p["stretch_ms"], ".2f"),
            "late_ms": fmt(p["late_ms"], ".2f"),
            "cpu_demand": fmt(p["cpu_demand"], ".3f"),
            "comm_cpu_demand": fmt(p["comm_cpu_demand"], ".3f"),
            # the probe: a 4-byte ring all-reduce, 2 (N-1) hops
            "allreduce_4b_ms": fmt(p["latency_ms"], ".3f"),
            # per hop between processes: 2 (M-1) hops for M of them
            "ring_hop_latency_ms": fmt(p["latency_ms"] /
                                       (2 * (p["processes"] - 1))
                                       if p["latency_ms"] and
                                       p["processes"] > 1 else None, ".3f"),
            "machine_busy": fmt(p["machine_busy"], ".3f"),
            "loadavg": p["loadavg"],
            "nice": p["nice"],
            "rt": p["rt"],
            "shm_spin_us": p["spin"],
            "valid": int(p["valid"]),
            "why_invalid": "; ".join(p["reasons"]),
        })
    fields = next(list(r.keys()) for r in rows if "processes" in r)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore",
                           restval="")
        w.writeheader()
        w.writerows(rows)
    return rows


def plot(pts, seed, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ns = sorted({n for (_, n) in pts} | {int(r["N"]) for r in seed})
    series = sorted({k[0] for k in pts}, key=order)
    mixed = len({split_key(s)[1] > 1 for s in series}) > 1
    groups = ["singa", "base"] + series
    width = 0.8 / len(groups)
    bar_handles = []
    fig, ax = plt.subplots(figsize=(11, 6))
    ax2 = ax.twinx()
    x = range(len(ns))
    seedn = {int(r["N"]): r for r in seed}
    for gi, g in enumerate(groups):
        xs, ys, hatch, edge = [], [], [], []
        for i, n in enumerate(ns):
            if g in ("singa", "base"):
                r = seedn.get(n)
                if r:
                    xs.append(i)
                    ys.append(r["singa_img_s" if g == "singa"
                                else "base_img_s"])
                    hatch.append(True)
                continue
            p = pts.get((g, n))
            if p and p["t_iter"]:
                xs.append(i)
                ys.append(32 * n / p["t_iter"])
                hatch.append(not p["valid"])
        off = (gi - (len(groups) - 1) / 2) * width
        if g in ("singa", "base"):
            ax.bar([v + off for v in xs], ys, width,
                   color="#bbbbbb" if g == "singa" else "#eeeeee",
                   edgecolor="#555555", hatch="..",
                   label=("SINGA" if g == "singa" else "SINGA's PS baseline")
                   + " img/s (read from the seed's figure)")
            continue
        cg = color(g, mixed)
        for v, y, bad in zip(xs, ys, hatch):
            ax.bar(v + off, y, width, color="white" if bad else cg,
                   edgecolor=cg, hatch="//" if bad else None)
        bar_handles.append(Patch(facecolor=cg, edgecolor=cg,
                                 label=label(g, mixed) + " img/s"))
    ax.set_yscale("log")
    ax.set_xticks(list(x))
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlabel("peers N (simulated GPUs)")
    ax.set_ylabel("throughput, images/s (bars, log scale)")

    sx = [ns.index(int(r["N"])) for r in seed]
    ax2.plot(sx, [r["singa_derived_comm_ms"] for r in seed], "k--o",
             mfc="white", label="SINGA comm. cost (seed's figure)")
    ax2.plot(sx, [r["base_derived_comm_ms"] for r in seed], ":s",
             color="#777777", mfc="white",
             label="SINGA's PS baseline comm. cost (seed's figure)")
    lines = []
    for s in series:
        base = pts.get((s, 1))
        if not base or not base["t_iter"]:
            continue
        vx, vy, ix, iy = [], [], [], []
        for i, n in enumerate(ns):
            p = pts.get((s, n))
            if not p or not p["t_iter"]:
                continue
            c = (p["t_iter"] - base["t_iter"]) * 1000
            (vx if p["valid"] else ix).append(i)
            (vy if p["valid"] else iy).append(c)
        lines.append((s, vx, vy, ix, iy))
    # the axis fits SINGA and meshtrain's valid points; larger values (the
    # PS baseline, invalid points) are drawn at the top with their value
    # written beside them
    top = max([r["base_derived_comm_ms"] for r in seed] +
              [max(vy) for (s, vx, vy, ix, iy) in lines
               if split_key(s)[0] != "ps" and vy]) * 1.25
    for (s, vx, vy, ix, iy) in lines:
        # at the centre of the series' bars, so that the lines stay apart
        off = (groups.index(s) - (len(groups) - 1) / 2) * width
        vx = [v + off for v in vx]
        ix = [v + off for v in ix]
        allx = sorted(vx + ix)
        pos = dict(zip(vx + ix, vy + iy))
        clip = [min(pos[i], top * 0.97) for i in allx]
        cs = color(s, mixed)
        ax2.plot(allx, clip, "-", color=cs, lw=2)
        ax2.plot(vx, [min(v, top * 0.97) for v in vy], "o", color=cs,
                 mec="black", label=label(s, mixed) + " comm. cost")
        if ix:
            ax2.plot(ix, [min(v, top * 0.97) for v in iy], "x",
                     color=cs, ms=9, mew=2)
        for i in allx:
            if pos[i] > top * 0.97:
                ax2.annotate("%.2f s" % (pos[i] / 1000), (i, top * 0.97),
                             textcoords="offset points",
                             xytext=(4, -12 - 11 * groups.index(s)),
                             color=cs, fontsize=8)
    ax2.plot([], [], "x", color="k", ms=9, mew=2,
             label="invalid: this machine's CPU limits the point")
    ax2.set_ylabel("communication cost t_iter(N) - t_iter(1), ms (lines)")
    ax2.set_ylim(0, top)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + bar_handles + h2, l1 + [h.get_label() for h in
                                           bar_handles] + l2,
              loc="upper left", fontsize=7.5)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--raw", required=True)
    ap.add_argument("--seed", required=True)
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png", help="the figure (needs matplotlib); none "
                                   "without it")
    ap.add_argument("--extra-csv", action="append", default=[],
                    help="an earlier run's CSV (another topology), drawn "
                         "beside this run and copied into --csv")
    ap.add_argument("--extra-series", default="",
                    help="only these series of --extra-csv (e.g. 'ring')")
    a = ap.parse_args()
    pts = load(a.raw)
    if not pts:
        sys.exit("scaling_plot.py: no points in %s" % a.raw)
    raw_pts = dict(pts)
    for path in a.extra_csv:
        for key, p in load_csv(path, a.extra_series.split()).items():
            pts.setdefault(key, p)
    seed = read_seed(a.seed)
    rows = table(pts, seed, a.csv)
    any_p = next(iter(raw_pts.values()))
    title = ("ResNet-50, batch 32 per peer, synchronous, simulated %s "
             "compute; 10 Gbit/s per host scaled by k = %s (tbf %s, "
             "gradients / %s)" % (any_p["profile"], any_p["k"],
                                  any_p["rate"], any_p["k"]))
    topo = sorted({(p["pph"], p["gpp"]) for p in raw_pts.values()})[-1]
    if topo != (1, 1):
        title += ("\n%d peers per host behind one shaped NIC (p2.8xlarge), "
                  "shared memory inside a host; %d simulated GPUs per "
                  "process" % topo)
    if a.png:
        plot(pts, seed, a.png, title)
    print("%-5s %4s %3s %3s %9s %8s %8s %6s %9s %6s %5s %5s  %s" %
          ("series", "N", "P", "G", "t_iter_s", "img/s", "comm_ms", "eff",
           "SINGA_ms", "str_ms", "cpu", "busy", "valid"))
    for r in rows:
        print("%-5s %4d %3s %3s %9s %8s %8s %6s %9s %6s %5s %5s  %s" %
              (r["series"], int(r["peers"]), r["peers_per_host"],
               r["gpus_per_process"], r["t_iter_s"], r.get("img_per_s", ""),
               r.get("comm_ms", ""), r.get("efficiency", ""),
               r.get("singa_comm_ms", ""), r.get("stretch_ms", ""),
               r.get("comm_cpu_demand", ""), r.get("machine_busy", ""),
               "yes" if str(r["valid"]) == "1" else
               "NO: " + r.get("why_invalid", "")))
    print("wrote %s" % " and ".join(x for x in (a.csv, a.png) if x))


if __name__ == "__main__":
    main()
