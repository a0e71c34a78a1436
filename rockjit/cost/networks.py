"""Layer lists of the four CNNs the seeds' README times as one kick (MobileNetV1/V2, ResNet-18,
Inception V1, all 224x224 int8), built from the architectures' published definitions, so each
network's MACs and DMA bytes are computed rather than guessed.

Architectures (facts, from the original papers): MobileNetV1 body table (Howard et al. 2017,
Table 1; 569 M mult-adds); MobileNetV2 bottleneck table t/c/n/s (Sandler et al. 2018, Table 2;
300 M multiply-adds); ResNet-18 (He et al. 2015, Table 1; 1.8 G FLOPs, counted as multiply-adds);
GoogLeNet / Inception V1 module table (Szegedy et al. 2014, Table 1; 1.5 G multiply-adds).
tests/cost checks the computed MACs against those published totals.

Every tensor is int8 (1 byte per element) as the seeds' whole-network path runs them. A layer
is one task of the kick: it reads its input feature map(s) and weights from DRAM and writes its
output (a chained run keeps tensors in DRAM in cube layout between layers; seeds README,
"Cube layout and chained runs").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    kind: str          # conv | dw | fc | pool | add
    macs: int
    weight_bytes: int
    in_bytes: int
    out_bytes: int


class _Net:
    def __init__(self) -> None:
        self.layers: list[Layer] = []

    def conv(self, hw: int, cin: int, cout: int, k: int, stride: int = 1) -> int:
        out = -(-hw // stride)
        self.layers.append(Layer("conv", out * out * cout * cin * k * k, cout * cin * k * k,
                                 hw * hw * cin, out * out * cout))
        return out

    def dw(self, hw: int, c: int, k: int = 3, stride: int = 1) -> int:
        out = -(-hw // stride)
        self.layers.append(Layer("dw", out * out * c * k * k, c * k * k, hw * hw * c,
                                 out * out * c))
        return out

    def pool(self, hw: int, c: int, stride: int, out: int | None = None) -> int:
        o = out if out is not None else -(-hw // stride)
        self.layers.append(Layer("pool", 0, 0, hw * hw * c, o * o * c))
        return o

    def fc(self, cin: int, cout: int) -> None:
        self.layers.append(Layer("fc", cin * cout, cin * cout, cin, cout))

    def add(self, hw: int, c: int) -> None:
        self.layers.append(Layer("add", 0, 0, 2 * hw * hw * c, hw * hw * c))


def mobilenet_v1() -> list[Layer]:
    n = _Net()
    hw = n.conv(224, 3, 32, 3, 2)
    c = 32
    for cout, s in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1),
                    (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]:
        hw = n.dw(hw, c, 3, s)
        hw = n.conv(hw, c, cout, 1)
        c = cout
    n.pool(hw, c, 1, out=1)
    n.fc(1024, 1000)
    return n.layers


def mobilenet_v2() -> list[Layer]:
    n = _Net()
    hw = n.conv(224, 3, 32, 3, 2)
    c = 32
    for t, cout, reps, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(reps):
            stride = s if i == 0 else 1
            hid = c * t
            h = hw
            if t != 1:
                h = n.conv(h, c, hid, 1)
            h = n.dw(h, hid, 3, stride)
            h = n.conv(h, hid, cout, 1)
            if stride == 1 and c == cout:
                n.add(h, cout)
            hw, c = h, cout
    hw = n.conv(hw, 320, 1280, 1)
    n.pool(hw, 1280, 1, out=1)
    n.fc(1280, 1000)
    return n.layers


def resnet18() -> list[Layer]:
    n = _Net()
    hw = n.conv(224, 3, 64, 7, 2)
    hw = n.pool(hw, 64, 2)
    c = 64
    for cout, s in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for b in range(2):
            stride = s if b == 0 else 1
            h = n.conv(hw, c, cout, 3, stride)
            h = n.conv(h, cout, cout, 3)
            if stride != 1 or c != cout:
                n.conv(hw, c, cout, 1, stride)
            n.add(h, cout)
            hw, c = h, cout
    n.pool(hw, 512, 1, out=1)
    n.fc(512, 1000)
    return n.layers


# GoogLeNet Table 1: #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj
_INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def inception_v1() -> list[Layer]:
    n = _Net()
    hw = n.conv(224, 3, 64, 7, 2)
    hw = n.pool(hw, 64, 2)
    hw = n.conv(hw, 64, 64, 1)
    hw = n.conv(hw, 64, 192, 3)
    hw = n.pool(hw, 192, 2)
    c = 192
    for name in ("3a", "3b", "4a", "4b", "4c", "4d", "4e", "5a", "5b"):
        if name in ("4a", "5a"):
            hw = n.pool(hw, c, 2)
        b1, r3, b3, r5, b5, pp = _INCEPTION[name]
        n.conv(hw, c, b1, 1)
        n.conv(hw, c, r3, 1)
        n.conv(hw, r3, b3, 3)
        n.conv(hw, c, r5, 1)
        n.conv(hw, r5, b5, 5)
        n.pool(hw, c, 1)
        n.conv(hw, c, pp, 1)
        c = b1 + b3 + b5 + pp
    n.pool(hw, c, 1, out=1)
    n.fc(1024, 1000)
    return n.layers


NETWORKS = {"MobileNetV1-224": mobilenet_v1, "MobileNetV2-224": mobilenet_v2,
            "ResNet-18-224": resnet18, "Inception V1-224": inception_v1}
