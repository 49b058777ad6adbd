#!/usr/bin/python3
"""gloo_allreduce: the Gloo anchor of bench/collectives.sh.

Times torch.distributed.all_reduce (backend "gloo", float32, sum) over a
geometric range of sizes and prints nccl-tests' columns, like meshbench and
bench/mpi_allreduce.c:

  size(B) count type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong

busbw = algbw * 2(n-1)/n, GB = 1e9 bytes; time is the slowest rank's mean.
Gloo's all_reduce is in place, so the timed calls reduce the same buffer
over and over (values scaled so they cannot overflow), and the contents
are checked on a separate, untimed call with known inputs.

One process per host. Run it once per rank:
  GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/gloo_allreduce.py \
      --rank R --world N --master 10.77.0.1 --port 29500 -b 4K -e 64M -f 2
Rank 0 hosts torch's TCPStore at --master:--port.
"""

import argparse
import datetime
import os
import sys
import time


def parse_size(s):
    mul = 1
    if s and s[-1] in "kKmMgG":
        mul = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[s[-1].lower()]
        s = s[:-1]
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError("bad size %r" % s)
    if v < 0:
        raise argparse.ArgumentTypeError("negative size %r" % s)
    return v * mul


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", default="127.0.0.1",
                    help="address of rank 0 (TCPStore)")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("-b", type=parse_size, default=8, help="min bytes")
    ap.add_argument("-e", type=parse_size, default=64 << 20,
                    help="max bytes")
    ap.add_argument("-f", type=int, default=2, help="size factor")
    ap.add_argument("-n", type=int, default=200, help="max iterations")
    ap.add_argument("-w", type=int, default=2, help="warmup iterations")
    ap.add_argument("-t", type=float, default=1.0,
                    help="target seconds per size")
    ap.add_argument("--timeout", type=float, default=120,
                    help="seconds before a stuck peer fails the run")
    a = ap.parse_args()
    if not (0 <= a.rank < a.world) or a.b < 4 or a.e < a.b or a.f < 2:
        ap.error("need 0 <= rank < world, 4 <= -b <= -e, -f >= 2")

    # Import late: torch takes seconds to load, argument errors should not.
    import torch
    import torch.distributed as dist

    # torch's default thread count, as in the anchors: a single thread
    # made Gloo's small all-reduces several times slower here.
    dist.init_process_group(
        "gloo", init_method="tcp://%s:%d" % (a.master, a.port),
        rank=a.rank, world_size=a.world,
        timeout=datetime.timedelta(seconds=a.timeout))
    n = a.world
    buf = torch.empty(a.e // 4, dtype=torch.float32)
    # Check input: rank+1 plus i % 7, so each sum is an exact small integer.
    idx7 = torch.arange(a.e // 4, dtype=torch.int64).remainder_(7)
    idx7 = idx7.to(torch.float32)

    if a.rank == 0:
        print("# gloo_allreduce: %d ranks, torch %s gloo all_reduce float "
              "sum, in-place" % (n, torch.__version__))
        print("#%12s %12s %8s %6s %6s %10s %8s %8s %6s" % (
            "size", "count", "type", "redop", "root", "time", "algbw",
            "busbw", "#wrong"))
        print("#%12s %12s %8s %6s %6s %10s %8s %8s %6s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)",
            ""))
        sys.stdout.flush()

    total_wrong = 0
    bw = []
    size = a.b
    while size <= a.e:
        count = size // 4
        view = buf[:count]
        view.fill_(1.0)
        for _ in range(a.w):
            dist.all_reduce(view)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(view)
        one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)
        iters = max(1, min(a.n, int(a.t / max(one.item(), 1e-9))))
        # The values grow by n-fold per call; reset them so none overflow.
        view.fill_(1.0 / n ** 8)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(view)
        mine = torch.tensor([(time.perf_counter() - t0) / iters],
                            dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        t = mine.item()

        view.copy_(idx7[:count]).add_(a.rank + 1)
        dist.all_reduce(view)
        want = idx7[:count] * n + n * (n + 1) / 2
        wrong = torch.tensor([int((view != want).sum().item())])
        dist.all_reduce(wrong)

        algbw = count * 4 / t / 1e9   # whole floats only
        busbw = algbw * 2 * (n - 1) / n
        if a.rank == 0:
            print(" %12d %12d %8s %6s %6d %10.1f %8.3f %8.3f %6d" % (
                count * 4, count, "float", "sum", -1, t * 1e6, algbw, busbw,
                wrong.item()))
            sys.stdout.flush()
        total_wrong += wrong.item()
        bw.append(busbw)
        if size > a.e // a.f:
            break
        size *= a.f

    if a.rank == 0:
        print("# Out of bounds values : %d %s" % (
            total_wrong, "FAILED" if total_wrong else "OK"))
        print("# Avg bus bandwidth    : %g" % (sum(bw) / max(len(bw), 1)))
    dist.destroy_process_group()
    return 1 if total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
