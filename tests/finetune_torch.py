#!/usr/bin/python3
"""PyTorch side of tests/test_finetune.c: torchvision's resnet18 as PyTorch
saves it, for --init.

  finetune_torch.py DIR   write DIR/tv18.st (F32), DIR/tv18-bf16.st (the
                          floats as BF16) and DIR/tv18-io.st (an input x
                          (2, 3, 64, 64) and the evaluation logits
                          (2, 1000) that torch computes from it)

The model is torchvision.models.resnet18() with a seeded random
initialisation (nothing can be downloaded here) and one training-mode
forward, so that the BN running statistics and num_batches_tracked (I64)
are not their defaults. The safetensors format is written by hand (the
python safetensors package is not needed).

Exit status: 0 written; 77 torch or torchvision cannot be imported (the
reason printed); anything else is a failure of the script.
"""
import json
import struct
import sys

try:
    import torch
    import torchvision
except ImportError as e:
    print("cannot import torch and torchvision: %s" % e)
    sys.exit(77)

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}


def write(path, tensors):
    header = {"__metadata__": {"format": "pt",
                               "writer": "torch " + torch.__version__}}
    blobs = []
    off = 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(d):
    torch.manual_seed(29)
    m = torchvision.models.resnet18()
    m.train()
    with torch.no_grad():
        m(torch.randn(4, 3, 64, 64) * 2 + 0.5)
    m.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits = m(x)
    sd = m.state_dict()
    write(d + "/tv18.st", sd)
    write(d + "/tv18-bf16.st",
          {k: v.bfloat16() if v.is_floating_point() else v
           for k, v in sd.items()})
    write(d + "/tv18-io.st", {"x": x, "logits": logits})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
