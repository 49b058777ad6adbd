#!/usr/bin/python3
"""PyTorch side of tests/test_nn_torch.c: the exact answer for one training
step of our ResNet, from torchvision's own modules.

usage: nn_torch_ref.py CASEDIR...

Each CASEDIR holds, written by the C test:
  cfg                  "arch=resnet34 width=16 cifar=0 size=128 batch=4
                       classes=100 own32=0 inch=3 smooth=0.1 momentum=0.9
                       wd=0.0001 nesterov=0" (width 64 without cifar:
                       torchvision's model itself; otherwise the same
                       network built from torchvision's BasicBlock/
                       Bottleneck and _make_layer with stage widths w, 2w,
                       4w, 8w and, for cifar, a 3x3 stride-1 conv1 and no
                       max pool; own32=1 asks for grad32m)
  weights.safetensors  our model's state (torchvision's names), loaded with
                       strict=True: every name and shape must match
  input.safetensors    "images" F32 (batch, 3, size, size), "labels" I32
  relu.safetensors     "relu.NNN": our output of each ReLU, forward order

and gets, from here:
  tv.safetensors       the torchvision model's state_dict as loaded
  ref.safetensors      (float64 results, stored as float32)
    logits, loss       training-mode forward, CrossEntropyLoss with label
                       smoothing smooth, in float64 from the float32 values
    grad.<param>       its gradients: the exact answer
    new.<buffer>       the BN running statistics after that forward
    sgd.<param>        the parameters after one SGD step on grad (lr 0.1,
                       cfg's momentum, weight decay and nesterov)
    sgd2.<param>       and after a second step on the same grad (the
                       momentum buffer's update)
    logitse            evaluation-mode forward (the running statistics as
                       loaded, before the training forward), float64;
    logitse32          and PyTorch's own in float32
    grad32.<param>     PyTorch's own float32 gradients
    logits32, loss32   PyTorch's own float32 forward
    new32.<buffer>     and the BN running statistics after it
    gradm.<param>      float64 gradients of the network whose every ReLU
                       (and the max pool) takes our mask: the exact
                       derivative of the piece of the piecewise-linear
                       network our float32 forward chose
    grad32m.<param>    (own32=1 only) the same on PyTorch float32's masks
                       and max-pool argmax: grad32 against grad32m is
                       PyTorch float32's arithmetic error on its own piece,
                       the yardstick for ours (gradm) where float32 itself
                       is ill-conditioned (resnet101/152, batch 2)
    flips              [our masks that differ from float64's, PyTorch
                       float32's that do, the largest |float64
                       pre-activation| at one of ours divided by PyTorch
                       float32's own worst error at that ReLU, the self
                       check of the site-by-site forward (relative error of
                       its logits against torchvision's forward) in float64,
                       and in float32 (0: pre32, hence grad32m's masks, are
                       those of PyTorch's float32 step)]

Why gradm: in training mode a pre-activation within float32 rounding of
zero (1e-6 of its scale) goes to either side of the ReLU depending on the
order of a sum, and in a small late layer one such element moves every
earlier gradient by up to 1e-2. PyTorch's float32 gradients flip too, at
other places. The arithmetic of a backward pass is checked against the
gradient of the piece its forward chose; the flips themselves are checked
to lie within float32's rounding (flips[2]).

The safetensors format is written directly (8-byte little-endian header
length, JSON header, raw little-endian data): the python3 safetensors
package is not installed here.
"""
import copy
import json
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torchvision.models import resnet as tvr

DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.int64: "I64"}
NP = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "F64": np.float64}
ARCHS = {"resnet18": (tvr.BasicBlock, [2, 2, 2, 2]),
         "resnet34": (tvr.BasicBlock, [3, 4, 6, 3]),
         "resnet50": (tvr.Bottleneck, [3, 4, 6, 3]),
         "resnet101": (tvr.Bottleneck, [3, 4, 23, 3]),
         "resnet152": (tvr.Bottleneck, [3, 8, 36, 3])}


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


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for name, v in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=NP[v["dtype"]])
        out[name] = torch.from_numpy(arr.reshape(v["shape"]).copy())
    return out


class Net(torch.nn.Module):
    """torchvision's ResNet at another width or with the CIFAR stem."""

    def __init__(self, arch, width, classes, cifar, inch=3):
        super().__init__()
        block, layers = ARCHS[arch]
        self._norm_layer = torch.nn.BatchNorm2d
        self.inplanes, self.dilation = width, 1
        self.groups, self.base_width = 1, 64
        if cifar:
            self.conv1 = torch.nn.Conv2d(inch, width, 3, 1, 1, bias=False)
            self.maxpool = torch.nn.Identity()
        else:
            self.conv1 = torch.nn.Conv2d(inch, width, 7, 2, 3, bias=False)
            self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.relu = torch.nn.ReLU(inplace=True)
        make = tvr.ResNet._make_layer
        self.layer1 = make(self, block, width, layers[0])
        self.layer2 = make(self, block, width * 2, layers[1], stride=2)
        self.layer3 = make(self, block, width * 4, layers[2], stride=2)
        self.layer4 = make(self, block, width * 8, layers[3], stride=2)
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(width * 8 * block.expansion, classes)

    def forward(self, x):
        return tvr.ResNet._forward_impl(self, x)


def build(cfg):
    arch, width, classes = cfg["arch"], int(cfg["width"]), int(cfg["classes"])
    cifar, inch = int(cfg["cifar"]), int(cfg.get("inch", 3))
    if width == 64 and not cifar:
        model = getattr(torchvision.models, arch)(num_classes=classes)
        if inch != 3:
            model.conv1 = torch.nn.Conv2d(inch, 64, 7, 2, 3, bias=False)
        return model
    return Net(arch, width, classes, cifar, inch)


def sites(model, x, masks=None, pool_from=None):
    """torchvision's forward written out ReLU by ReLU, in our order. With
    masks, ReLU k multiplies by masks[k]; with pool_from, the max pool takes
    the argmax of that tensor (our stem output). Returns the logits and
    every ReLU's input."""
    pre, it = [], iter(masks or [])

    def relu(v):
        pre.append(v)
        return torch.relu(v) if masks is None else v * next(it)

    x = relu(model.bn1(model.conv1(x)))
    if isinstance(model.maxpool, torch.nn.MaxPool2d):
        if pool_from is None:
            x = model.maxpool(x)
        else:
            _, idx = F.max_pool2d(pool_from, 3, 2, 1, return_indices=True)
            x = x.flatten(2).gather(2, idx.flatten(2)).view(idx.shape)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for blk in layer:
            o = relu(blk.bn1(blk.conv1(x)))
            if isinstance(blk, tvr.Bottleneck):
                o = relu(blk.bn2(blk.conv2(o)))
                o = blk.bn3(blk.conv3(o))
            else:
                o = blk.bn2(blk.conv2(o))
            idt = blk.downsample(x) if blk.downsample is not None else x
            x = relu(o + idt)
    x = torch.flatten(model.avgpool(x), 1)
    return model.fc(x), pre


def one_case(d):
    cfg = dict(kv.split("=") for kv in open(d + "/cfg").read().split())
    model = build(cfg)
    state = load(d + "/weights.safetensors")
    model.load_state_dict(state, strict=True)
    save(d + "/tv.safetensors", model.state_dict())
    inp = load(d + "/input.safetensors")
    relus = load(d + "/relu.safetensors")
    ours = [relus[k] for k in sorted(relus)]
    images, labels = inp["images"], inp["labels"].long()
    xent = torch.nn.CrossEntropyLoss(
        label_smoothing=float(cfg.get("smooth", 0.1)))

    # In training mode a forward's outputs do not depend on the running
    # statistics it updates, so one model serves several forwards (a copy
    # of a resnet152 costs 0.1 s): whatever is kept from it is kept first.
    # The float64 copies are taken before the float32 step touches model.
    m64 = copy.deepcopy(model).double().train()
    mm = copy.deepcopy(model).double().train()
    with torch.no_grad():
        logitse = copy.deepcopy(model).double().eval()(images.double())
        logitse32 = copy.deepcopy(model).eval()(images)

    # PyTorch float32: its forward, its gradients, and its ReLU inputs
    m32 = model.train()
    logits32 = m32(images)
    loss32 = xent(logits32, labels)
    loss32.backward()
    grad32 = {"grad32." + n: p.grad for n, p in m32.named_parameters()}
    grad32["logits32"] = logits32
    grad32["loss32"] = loss32.reshape(1)
    for n, t in m32.state_dict().items():
        if t.dtype == torch.float32:
            grad32["new32." + n] = t.clone()
    with torch.no_grad():
        chk32, pre32 = sites(m32, images)
    selfcheck32 = ((chk32 - logits32).abs().max() /
                   logits32.abs().max()).item()

    # float64: the exact answer, through torchvision's own forward
    x64 = images.double()
    opt = torch.optim.SGD(m64.parameters(), lr=0.1,
                          momentum=float(cfg.get("momentum", 0.9)),
                          weight_decay=float(cfg.get("wd", 1e-4)),
                          nesterov=bool(int(cfg.get("nesterov", 0))))
    opt.zero_grad()
    logits = m64(x64)
    loss = xent(logits, labels)
    loss.backward()
    ref = {"logits": logits, "loss": loss.reshape(1)}
    for n, p in m64.named_parameters():
        ref["grad." + n] = p.grad
    for n, t in m64.state_dict().items():
        if t.dtype == torch.float64:
            ref["new." + n] = t
    opt.step()
    for n, p in m64.named_parameters():
        ref["sgd." + n] = p.detach().clone()
    opt.step()
    for n, p in m64.named_parameters():
        ref["sgd2." + n] = p.detach().clone()
    ref["logitse"], ref["logitse32"] = logitse, logitse32

    with torch.no_grad():
        chk, pre64 = sites(mm, x64)
    selfcheck = ((chk - logits).abs().max() / logits.abs().max()).item()

    # float64 on our masks
    masks = [(o > 0).double() for o in ours]
    lm, _ = sites(mm, x64, masks, ours[0].double())
    xent(lm, labels).backward()
    for n, p in mm.named_parameters():
        ref["gradm." + n] = p.grad

    # float64 on PyTorch float32's masks (and its max pool's argmax), for
    # the cases judged against PyTorch float32's own error
    if int(cfg.get("own32", 0)):
        mm.zero_grad(set_to_none=True)
        masks = [(p > 0).double() for p in pre32]
        lm, _ = sites(mm, x64, masks, torch.relu(pre32[0]))
        xent(lm, labels).backward()
        for n, p in mm.named_parameters():
            ref["grad32m." + n] = p.grad

    # where our masks and float64's differ, and how close to zero
    nflip = nflip32 = 0
    margin = 0.0
    for o, p64, p32 in zip(ours, pre64, pre32):
        band = (p32.double() - p64).abs().max().item()
        f = (o > 0) != (p64 > 0)
        nflip += int(f.sum())
        nflip32 += int(((p32 > 0) != (p64 > 0)).sum())
        if f.any():
            worst = p64[f].abs().max().item()
            margin = max(margin, worst / band if band > 0 else float("inf"))
    ref["flips"] = torch.tensor([nflip, nflip32, margin, selfcheck,
                                 selfcheck32], dtype=torch.float64)
    ref.update(grad32)
    save(d + "/ref.safetensors", ref)


def main():
    torch.set_num_threads(2)
    for d in sys.argv[1:]:
        one_case(d)
    print("# torch %s torchvision %s: %d cases" %
          (torch.__version__, torchvision.__version__, len(sys.argv) - 1))


if __name__ == "__main__":
    main()
