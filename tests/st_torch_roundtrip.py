#!/usr/bin/python3
"""PyTorch side of the safetensors interoperability test.

Run by tests/test_safetensors.c, never alone; the python safetensors package
is not used: the format is written and read here by hand.

  st_torch_roundtrip.py write PATH   write torch tensors to PATH
  st_torch_roundtrip.py check PATH   read PATH (written by meshtrain) and
                                     compare it with what torch computes

Both sides generate the same float32 bit patterns with one LCG, so each can
check the other's F32 -> F16/BF16 rounding bit for bit. The model tensors
come from a seeded torch module with torchvision's names ("0.weight",
"1.running_mean", "1.num_batches_tracked"...); meshtrain reads them, writes
them back with num_batches_tracked + 1, and "check" loads that file into a
fresh module with load_state_dict(strict=True).
"""
import json
import struct
import sys

import torch

DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
    torch.uint8: "U8",
}
BY_NAME = {v: k for k, v in DTYPES.items()}


def lcg_bits(n, seed=12345):
    """n float32 bit patterns; the C test has the same generator."""
    out = []
    s = seed
    for _ in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out.append(s)
    b = struct.pack("<%dI" % n, *out)
    return torch.frombuffer(bytearray(b), dtype=torch.float32).clone()


def model():
    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False),
                            torch.nn.BatchNorm2d(4), torch.nn.Linear(5, 2))
    with torch.no_grad():  # non-trivial running statistics
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
        m[1].num_batches_tracked.fill_(42)
    return m


def write(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    off = 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = (t.reshape(-1).view(torch.uint8).numpy().tobytes()
               if t.numel() else b"")
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    buf = bytearray(data[8 + n:])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = BY_NAME[info["dtype"]]
        t = torch.frombuffer(buf[b:e], dtype=dt) if e > b else \
            torch.empty(0, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out, meta


def same_bits(a, b):
    """Bitwise equality, except that any NaN matches any NaN: torch's own
    NaN bits depend on the code path (1.13 rounds NaN to BF16 0xffff when
    vectorised, 0x7fc0 when scalar)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    size = a.element_size()
    same = a.view(view[size]) == b.view(view[size])
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return bool(same.all())


def cmd_write(path):
    bits = lcg_bits(4096).reshape(64, 64)
    allhalf = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    allhalf = allhalf.view(torch.float16)
    t = {
        "bits.f32": bits,
        "bits.f16": bits.half(),
        "bits.bf16": bits.bfloat16(),
        "allhalf.f16": allhalf,
        "allhalf.f32": allhalf.float(),
        "allbf16.bf16": torch.arange(65536, dtype=torch.int32)
        .to(torch.int16).view(torch.bfloat16),
    }
    t["allbf16.f32"] = t["allbf16.bf16"].float()
    for k, v in model().state_dict().items():
        t["model." + k] = v
    write(path, t, {"format": "pt", "writer": "torch " + torch.__version__})
    return 0


def cmd_check(path):
    got, meta = read(path)
    bad = 0

    def check(cond, what):
        nonlocal bad
        print(("ok: " if cond else "MISMATCH: ") + what)
        if not cond:
            bad += 1

    check(meta.get("format") == "pt", "metadata format=pt")
    bits = lcg_bits(4096).reshape(64, 64)
    check(same_bits(got["bits.f32"], bits), "F32 bit patterns")
    check(same_bits(got["bits.f16"], bits.half()),
          "meshtrain F32 -> F16 equals torch .half() (NaN: any NaN)")
    check(same_bits(got["bits.bf16"], bits.bfloat16()),
          "meshtrain F32 -> BF16 equals torch .bfloat16() (NaN: any NaN)")
    sd = {k[len("model."):]: v for k, v in got.items()
          if k.startswith("model.")}
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False),
                            torch.nn.BatchNorm2d(4), torch.nn.Linear(5, 2))
    try:
        m.load_state_dict(sd, strict=True)
        check(True, "load_state_dict(strict=True) of %d tensors" % len(sd))
    except RuntimeError as e:
        check(False, "load_state_dict: %s" % e)
    ref = model().state_dict()
    for k, v in ref.items():
        if k == "1.num_batches_tracked":
            want = v + 1
        else:
            want = v
        check(k in sd and same_bits(sd[k], want), "model tensor %s" % k)
    return 1 if bad else 0


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: st_torch_roundtrip.py write|check PATH",
              file=sys.stderr)
        return 2
    if sys.argv[1] == "write":
        return cmd_write(sys.argv[2])
    return cmd_check(sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
