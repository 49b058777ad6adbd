#!/usr/bin/python3
"""bench/nn_step_torch.py: the PyTorch side of bench/nn_step.sh: torchvision
ResNet training steps (forward, loss, backward, SGD momentum 0.9, weight
decay 1e-4) on random data; prints s/iter, img/s, CPU seconds per step (user
and system, every thread) and peak RSS.

usage: nn_step_torch.py MODEL BATCH SIZE ITERS WARMUP THREADS [fp32|bf16]

bf16: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16),
PyTorch's mixed precision on the CPU (convolutions and matmuls in bfloat16,
float32 master weights and SGD).
"""
import contextlib
import resource
import sys
import time

import torch
import torchvision


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    arch, batch, size, iters, warmup, threads = sys.argv[1:7]
    prec = sys.argv[7] if len(sys.argv) > 7 else "fp32"
    if prec not in ("fp32", "bf16"):
        sys.exit("nn_step_torch.py: precision is fp32 or bf16, not %s" % prec)
    batch, size, iters, warmup, threads = map(int, (batch, size, iters, warmup, threads))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = getattr(torchvision.models, arch)()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                          weight_decay=1e-4)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 1000, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    for it in range(warmup + iters):
        if it == warmup:
            t0, c0 = time.time(), cpu_s()
        opt.zero_grad()
        amp = (torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16"
               else contextlib.nullcontext())
        with amp:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print("# iter %d loss %.4f" % (it, loss.item()), file=sys.stderr)
    total, cpu = time.time() - t0, cpu_s() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("pytorch %s %s %s batch %d %dx%d threads %d: %.3f s/iter %.2f img/s "
          "%.3f CPU-s/iter peak RSS %.0f MiB" % (
              torch.__version__, prec, arch, batch, size, size, threads,
              total / iters, batch * iters / total, cpu / iters, rss))


if __name__ == "__main__":
    main()
