#!/usr/bin/python3
"""bench/nn_step_torch.py: the PyTorch side of bench/nn_step.sh: torchvision
ResNet training steps (forward, loss, backward, SGD momentum 0.9, weight
decay 1e-4) on random data; prints s/iter, img/s and peak RSS.

usage: nn_step_torch.py MODEL BATCH SIZE ITERS WARMUP THREADS
"""
import resource
import sys
import time

import torch
import torchvision


def main():
    arch, batch, size, iters, warmup, threads = sys.argv[1:7]
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
            t0 = time.time()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print("# iter %d loss %.4f" % (it, loss.item()), file=sys.stderr)
    total = time.time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("pytorch %s %s batch %d %dx%d threads %d: %.3f s/iter %.2f img/s "
          "peak RSS %.0f MiB" % (torch.__version__, arch, batch, size, size,
                                 threads, total / iters, batch * iters / total,
                                 rss))


if __name__ == "__main__":
    main()
