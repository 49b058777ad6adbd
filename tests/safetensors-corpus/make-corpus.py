#!/usr/bin/python3
"""Regenerate the safetensors seed corpus in this directory.

Each file is a safetensors file written byte by byte: good-*.st must load,
every other one is malformed in exactly one way. tests/test_safetensors.c
holds the message fragment each must be rejected with. Run it from this
directory: /usr/bin/python3 make-corpus.py
"""
import json
import struct


def raw(name, header, data=b"", hlen=None):
    """header: bytes of the JSON text; hlen overrides the length field."""
    if isinstance(header, str):
        header = header.encode("utf-8")
    n = len(header) if hlen is None else hlen
    with open(name, "wb") as f:
        f.write(struct.pack("<Q", n) + header + data)


def st(name, tensors, data, meta=None, pad=True, **kw):
    """tensors: list of (name, dtype, shape, [begin, end])."""
    h = {}
    if meta is not None:
        h["__metadata__"] = meta
    for tn, dt, shape, offs in tensors:
        h[tn] = {"dtype": dt, "shape": shape, "data_offsets": offs}
    text = json.dumps(h, **kw).encode("utf-8")
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    raw(name, text, data)


F32x4 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)

# Files that load.
st("good-basic.st",
   [("conv.weight", "F32", [2, 2], [0, 16]),
    ("bn.num_batches_tracked", "I64", [], [16, 24])],
   F32x4 + struct.pack("<q", 7), meta={"format": "pt"})
raw("good-empty.st", b"{}      ")
st("good-zero-size.st",
   [("a", "F32", [0, 3], [0, 0]), ("b", "F16", [2], [0, 4]),
    ("c", "BF16", [0], [4, 4])],
   struct.pack("<2H", 0x3c00, 0xc000))
st("good-escapes.st",
   [("na\u00efve/\"q\"\\\t\U0001F600", "BF16", [1, 2], [0, 4]),
    ("u8", "U8", [3], [4, 7]), ("i32", "I32", [1], [7, 11])],
   struct.pack("<2H", 0x3f80, 0x4000) + b"\x01\x02\x03" +
   struct.pack("<i", -5),
   meta={"k\u00e9y": "v\nal", "empty": ""}, indent=2, ensure_ascii=True)
# The reference implementation orders the buffer by offset, not by name.
st("good-out-of-order.st",
   [("second", "F32", [2], [8, 16]), ("first", "F32", [2], [0, 8])],
   F32x4)

# The length field.
with open("short-file.st", "wb") as f:
    f.write(b"\x02\x00\x00")
raw("header-too-large.st", b"{}", hlen=100000001)
raw("header-past-eof.st", b"{}", hlen=1000)
raw("header-tiny.st", b"{", hlen=1)
raw("header-zero.st", b"", hlen=0)
raw("header-huge-u64.st", b"{}", hlen=0xffffffffffffffff)

# JSON syntax.
raw("not-object.st", b"[]")
raw("leading-space.st", b" {}")
raw("unterminated-string.st", b'{"a":{"dtype":"F32')
raw("unterminated-object.st", b'{"a":{"dtype":"F32","shape":[1],'
    b'"data_offsets":[0,4]}', F32x4[:4])
raw("trailing-comma.st", b'{"a":{"dtype":"F32","shape":[1],'
    b'"data_offsets":[0,4]},}', b"\0" * 4)
raw("missing-colon.st", b'{"a" {"dtype":"F32"}}')
raw("bad-escape.st", b'{"a\\q":{}}')
raw("short-unicode-escape.st", b'{"a\\u12":{}}')
raw("lone-low-surrogate.st", b'{"a\\udc00":{}}')
raw("lone-high-surrogate.st", b'{"a\\ud800x":{}}')
raw("nul-in-name.st", b'{"a\\u0000b":{}}')
raw("control-char.st", b'{"a\x01":{}}')
raw("bad-utf8.st", b'{"a\xff":{}}')
raw("overlong-utf8.st", b'{"a\xc0\xaf":{}}')
raw("surrogate-utf8.st", b'{"a\xed\xa0\x80":{}}')
raw("header-trailing-garbage.st", b"{} x")
raw("header-nul-padding.st", b"{}\0\0\0\0\0\0")
raw("deep-nesting.st", b'{"a":' + b"[" * 10000 + b"]" * 10000 + b"}")
raw("deep-shape.st", b'{"a":{"dtype":"F32","shape":' + b"[" * 10000 +
    b"]" * 10000 + b',"data_offsets":[0,0]}}')
raw("literal-true.st", b'{"a":{"dtype":true}}')

# Names, fields and metadata.
raw("duplicate-name.st",
    b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
    b'"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', F32x4[:8])
raw("duplicate-name-escaped.st",
    b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
    b'"\\u0077":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
    F32x4[:8])
raw("duplicate-field.st",
    b'{"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}',
    F32x4[:4])
raw("duplicate-metadata.st",
    b'{"__metadata__":{},"__metadata__":{}}')
raw("duplicate-metadata-key.st",
    b'{"__metadata__":{"a":"1","b":"2","a":"3"}}')
raw("metadata-not-string.st", b'{"__metadata__":{"a":1}}')
raw("metadata-not-object.st", b'{"__metadata__":"x"}')
raw("tensor-not-object.st", b'{"w":[0,4]}')
st("unknown-field.st", [("w", "F32", [1], [0, 4])], F32x4[:4])
with open("unknown-field.st", "wb") as f:
    h = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"foo":1}}'
    f.write(struct.pack("<Q", len(h)) + h + F32x4[:4])
st("unknown-dtype.st", [("w", "F17", [1], [0, 4])], F32x4[:4])
st("dtype-lowercase.st", [("w", "f32", [1], [0, 4])], F32x4[:4])
raw("missing-dtype.st", b'{"w":{"shape":[1],"data_offsets":[0,4]}}',
    F32x4[:4])
raw("missing-shape.st", b'{"w":{"dtype":"F32","data_offsets":[0,4]}}',
    F32x4[:4])
raw("missing-offsets.st", b'{"w":{"dtype":"F32","shape":[1]}}', F32x4[:4])
raw("empty-entry.st", b'{"w":{}}')

# Numbers.
raw("negative-shape.st",
    b'{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', F32x4[:4])
raw("float-shape.st",
    b'{"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', F32x4[:4])
raw("exponent-offset.st",
    b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4e0]}}', F32x4[:4])
raw("leading-zero.st",
    b'{"w":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', F32x4[:4])
raw("shape-int-overflow.st",
    b'{"w":{"dtype":"F32","shape":[9223372036854775808],'
    b'"data_offsets":[0,4]}}', F32x4[:4])
raw("offset-u64-overflow.st",
    b'{"w":{"dtype":"F32","shape":[1],'
    b'"data_offsets":[0,18446744073709551616]}}', F32x4[:4])
st("elements-overflow.st", [("w", "F32", [4294967296, 4294967296, 2],
                             [0, 4])], F32x4[:4])
st("bytes-overflow.st", [("w", "F64", [4611686018427387904], [0, 4])],
   F32x4[:4])
st("too-many-dims.st", [("w", "F32", [1] * 9, [0, 4])], F32x4[:4])
st("offsets-three.st", [("w", "F32", [1], [0, 4, 8])], F32x4[:4])
st("offsets-one.st", [("w", "F32", [1], [0])], F32x4[:4])
st("offsets-reversed.st", [("w", "F32", [0], [4, 0])], F32x4[:4])

# Sizes and the data buffer.
st("nbytes-mismatch.st", [("layer1.0.conv1.weight", "F32", [2, 2], [0, 8])],
   F32x4[:8])
st("offsets-out-of-range.st", [("fc.bias", "F32", [4], [0, 16])], F32x4[:8])
st("overlap.st", [("a", "F32", [2], [0, 8]), ("b", "F32", [2], [4, 12])],
   F32x4[:12])
st("overlap-zero-size.st", [("a", "F32", [2], [0, 8]),
                            ("z", "F32", [0], [4, 4])], F32x4[:8])
st("overlap-same.st", [("a", "F32", [2], [0, 8]), ("b", "F32", [2], [0, 8])],
   F32x4[:8])
st("hole.st", [("a", "F32", [1], [0, 4]), ("b", "F32", [1], [8, 12])],
   F32x4[:12])
st("hole-at-start.st", [("a", "F32", [1], [4, 8])], F32x4[:8])
st("trailing-garbage.st", [("a", "F32", [1], [0, 4])], F32x4[:8])
raw("no-tensors-with-data.st", b"{}", b"\0" * 4)

# Messages quote names escaped and cut to 96 bytes.
raw("long-name.st", b'{"' + b"n" * 40 + b"\\n" + b"m" * 260 +
    b'":{"dtype":"F17","shape":[],"data_offsets":[0,0]}}')
