#!/usr/bin/env python3
"""tests/gpu/torch_time.py: PyTorch's ResNet-50 training throughput, the
reference for tests/gpu/nn_time (same step: forward, cross-entropy,
backward, SGD with momentum 0.9 and weight decay 1e-4; random images), in
PyTorch's best eager settings: channels-last model and images,
cudnn.benchmark on, the loss kept on the GPU and read once at the end.

  torch_time.py PRECISION BATCH [STEPS [WARMUP]]
      PRECISION: fp32 (TF32 off), tf32 (TF32 on for matmul and cuDNN),
      bf16-amp (autocast to bfloat16; fp32 master weights).

Prints "torch_time precision=P batch=B img_s=X", or exits 3 with a reason
when torch, torchvision or a CUDA device is missing.
"""
import sys
import time


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    prec, batch = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    if prec not in ("fp32", "tf32", "bf16-amp"):
        print("torch_time: unknown precision %r" % prec, file=sys.stderr)
        return 2
    try:
        import torch
        import torchvision
    except ImportError as e:
        print("torch_time: %s" % e, file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("torch_time: torch sees no CUDA device", file=sys.stderr)
        return 3
    tf32 = prec != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    cl = torch.channels_last
    model = torchvision.models.resnet50().to(dev, memory_format=cl)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                          weight_decay=1e-4)
    lossf = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 224, 224, device=dev).to(memory_format=cl)
    y = torch.randint(0, 1000, (batch,), device=dev)
    amp = prec == "bf16-amp"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    last = loss.item()
    dt = time.perf_counter() - t0
    print("torch_time precision=%s batch=%d s_per_step=%.5f img_s=%.1f "
          "loss=%.4f torch=%s" % (prec, batch, dt / steps, batch * steps / dt,
                                  last, torch.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
