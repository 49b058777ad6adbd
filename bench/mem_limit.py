#!/usr/bin/python3
"""mem_limit: the memory-bandwidth limit beside the all-reduce figures.

usage: mem_limit.py [MIB]      (default 64: buffers far larger than caches)

Prints GB/s of a memcpy (bytes copied) and of a float32 sum y += x (bytes
of x streamed), each with 1 process and with 2 processes at once (their
total), best of 5 runs. numpy's copyto and add run one thread each, so
processes are the cores. A 4-rank all-reduce of B bytes over shared
memory moves at least about 2 (N - 1) / N x B through each rank's memory
twice (one copy in, one sum), so these bound what any system can reach on
one host.
"""

import multiprocessing as mp
import sys
import time

import numpy as np


def one(kind, n, runs, q):
    x = np.ones(n, dtype=np.float32)
    y = np.zeros(n, dtype=np.float32)
    best = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        if kind == "memcpy":
            np.copyto(y, x)
        else:
            np.add(y, x, out=y)
        dt = time.perf_counter() - t0
        best = max(best, x.nbytes / dt / 1e9)
    q.put(best)


def measure(kind, nproc, n, runs=5):
    q = mp.Queue()
    ps = [mp.Process(target=one, args=(kind, n, runs, q))
          for _ in range(nproc)]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    return total


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    n = mib * (1 << 20) // 4
    print("memory-bandwidth limit, %d MiB buffers (GB/s, best of 5):" % mib)
    for kind in ("memcpy", "sum"):
        print("%-7s 1 process %.2f, 2 processes %.2f (total)" % (
            kind, measure(kind, 1, n), measure(kind, 2, n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
