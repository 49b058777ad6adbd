#!/usr/bin/python3
"""PyTorch side of tests/test_nn_torch.c: one training step of a torchvision
ResNet, written as safetensors for the C test to compare against.

usage: nn_torch_ref.py ARCH OUTDIR BATCH SIZE CLASSES SEED

Writes, in OUTDIR:
  weights.safetensors  the initial state_dict (torchvision's names)
  input.safetensors    "images" F32 (BATCH, 3, SIZE, SIZE), "labels" I32
  ref.safetensors      (computed in float64, stored as float32) "logits", "loss" (1), "grad.<param>" for every
                       parameter after one training-mode forward+backward
                       (CrossEntropyLoss, label_smoothing 0.1), "new.<name>"
                       for every parameter after one SGD step (lr 0.1,
                       momentum 0.9, weight decay 1e-4) and "new.<bn>.running_*"
                       for the running statistics after the forward, and
                       "grad32.<param>", PyTorch's own float32 gradients.
The safetensors format is written directly (8-byte little-endian header
length, JSON header, raw little-endian data): the python3 safetensors package
is not installed here.
"""
import copy
import json
import struct
import sys

import torch
import torchvision

DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.int64: "I64"}


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.float64:
            t = t.float()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def main():
    arch, out, batch, size, classes, seed = sys.argv[1:7]
    batch, size, classes, seed = int(batch), int(size), int(classes), int(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    model = getattr(torchvision.models, arch)(num_classes=classes)
    # Non-trivial BN parameters and statistics, so that their gradients and
    # updates are checked on values that are not all 1 and 0.
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.8, 1.2)
                mod.num_batches_tracked.fill_(3)
    save(out + "/weights.safetensors", model.state_dict())
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, classes, (batch,), dtype=torch.int64)
    save(out + "/input.safetensors",
         {"images": images, "labels": labels.to(torch.int32)})

    # PyTorch's own float32 gradients ("grad32.<param>"): how far float32
    # arithmetic itself lands from the exact answer for this input (ReLU
    # masks flipped by rounding, BN over few samples), the baseline for
    # ill-conditioned tensors.
    m32 = copy.deepcopy(model)
    m32.train()
    loss32 = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(m32(images), labels)
    loss32.backward()
    grad32 = {"grad32." + n: p.grad for n, p in m32.named_parameters()}

    # The reference runs in float64 from the same float32 values: it is the
    # exact answer for the float32 inputs, so the C side's float32 error is
    # measured against it rather than against PyTorch's own float32 error.
    model.double()
    images = images.double()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                          weight_decay=1e-4)
    opt.zero_grad()
    logits = model(images)
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(logits, labels)
    loss.backward()
    ref = {"logits": logits, "loss": loss.reshape(1)}
    for name, p in model.named_parameters():
        ref["grad." + name] = p.grad
    opt.step()
    for name, t in model.state_dict().items():
        if t.dtype == torch.float64:
            ref["new." + name] = t
    ref.update(grad32)
    save(out + "/ref.safetensors", ref)
    print("# torch %s torchvision %s: %s loss %.6f" %
          (torch.__version__, torchvision.__version__, arch, loss.item()))


if __name__ == "__main__":
    main()
