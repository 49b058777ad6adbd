#!/usr/bin/python3
"""PyTorch side of the safetensors interoperability test.

Run by tests/test_safetensors.c, never alone; the python safetensors package
is not used: the format is written and read here by hand.

  st_torch_roundtrip.py write DIR    write torch tensors to DIR/torch.st,
                                     and a seeded torchvision resnet18's
                                     state_dict to DIR/r18.st
  st_torch_roundtrip.py check DIR    read DIR/ours.st and DIR/r18-ours.st
                                     (written by meshtrain) and compare them
                                     with what torch computes

Exit status: 0 all good; 77 torch cannot be imported (the reason printed);
4 ours.st differs; 8 r18-ours.st differs; 12 both; anything else is a
failure of the script itself. A missing torchvision is not an error: r18.st
is then not written, and the reason is printed.

Both sides generate the same float32 bit patterns with one LCG, so each can
check the other's F32 -> F16/BF16 rounding bit for bit. The model tensors
come from a seeded torch module with torchvision's names ("0.weight",
"1.running_mean", "1.num_batches_tracked"...); meshtrain reads them, writes
them back with num_batches_tracked + 1, and "check" loads that file into a
fresh module with load_state_dict(strict=True).
"""
import json
import os
import struct
import sys

try:
    import torch
except ImportError as e:
    print("cannot import torch: %s" % e)
    sys.exit(77)

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


def cmd_write_small(path):
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


def cmd_check_small(path):
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


def resnet18():
    import torchvision
    torch.manual_seed(11)
    m = torchvision.models.resnet18()
    with torch.no_grad():  # buffers that differ from their initial values
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-1, 1)
                mod.running_var.uniform_(0.5, 2)
                mod.num_batches_tracked.fill_(1000)
    return m.state_dict()


def cmd_write_resnet18(path):
    write(path, resnet18(), {"format": "pt"})
    return 0


def cmd_check_resnet18(path):
    import torchvision
    got, _ = read(path)
    ref = resnet18()
    m = torchvision.models.resnet18()
    try:
        m.load_state_dict(got, strict=True)
    except RuntimeError as e:
        print("MISMATCH: load_state_dict: %s" % e)
        return 1
    bad = [k for k, v in ref.items() if not same_bits(got[k], v)]
    print("%s: resnet18 load_state_dict(strict=True) of %d tensors, %d "
          "differ %s" % ("ok" if not bad else "MISMATCH", len(got), len(bad),
                         bad[:5]))
    return 1 if bad else 0


def cmd_write(d):
    cmd_write_small(os.path.join(d, "torch.st"))
    try:
        import torchvision  # noqa: F401
    except ImportError as e:
        print("cannot import torchvision: %s" % e)
        return 0
    return cmd_write_resnet18(os.path.join(d, "r18.st"))


def cmd_check(d):
    rc = 4 if cmd_check_small(os.path.join(d, "ours.st")) else 0
    r18 = os.path.join(d, "r18-ours.st")
    if os.path.exists(r18) and cmd_check_resnet18(r18):
        rc |= 8
    return rc


def main():
    verbs = {"write": cmd_write, "check": cmd_check}
    if len(sys.argv) != 3 or sys.argv[1] not in verbs:
        print("usage: st_torch_roundtrip.py write|check DIR", file=sys.stderr)
        return 2
    return verbs[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
