"""A 2-D convolution's description (NCHW / OIHW) and the cubes it reads and writes."""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.types import DType
from ..layouts import CubeLayout
from ..profile import ChipProfile
from ..regcmd import LoweringError
from ..tiling import ConvShape, round_up

_SUPPORTED = {(DType.F16, DType.F16), (DType.F16, DType.F32), (DType.I8, DType.I32)}


@dataclass(frozen=True)
class ConvSpec:
    """A 2-D convolution, NCHW / OIHW (the IR's conv operand order)."""

    batch: int
    in_c: int
    height: int
    width: int
    out_c: int
    kh: int
    kw: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))   # (top, bottom), (left, right)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    @property
    def out_h(self) -> int:
        (pt, pb), _ = self.padding
        return (self.height + pt + pb - (self.kh - 1) * self.dilation[0] - 1) // self.stride[0] + 1

    @property
    def out_w(self) -> int:
        _, (pl, pr) = self.padding
        return (self.width + pl + pr - (self.kw - 1) * self.dilation[1] - 1) // self.stride[1] + 1

    @property
    def depthwise(self) -> bool:
        return self.groups > 1

    def macs(self) -> int:
        per = self.kh * self.kw * (1 if self.depthwise else self.in_c)
        return self.batch * self.out_h * self.out_w * self.out_c * per


def validate(spec: ConvSpec, in_dtype: DType, out_dtype: DType) -> None:
    if (in_dtype, out_dtype) not in _SUPPORTED:
        ok = ", ".join(f"{i.value}->{o.value}" for i, o in sorted(_SUPPORTED, key=str))
        raise LoweringError(f"conv {in_dtype.value} -> {out_dtype.value} is not supported; "
                            f"supported: {ok}")
    if min(spec.batch, spec.in_c, spec.height, spec.width, spec.out_c, spec.kh, spec.kw) < 1:
        raise LoweringError(f"conv dimensions must be >= 1: {spec}")
    if min(*spec.stride, *spec.dilation) < 1 or min(x for pr in spec.padding for x in pr) < 0:
        raise LoweringError(f"strides/dilations must be >= 1 and padding >= 0: {spec}")
    if spec.groups != 1 and not (spec.groups == spec.in_c == spec.out_c):
        raise LoweringError(
            f"grouped conv with {spec.groups} groups of {spec.in_c} -> {spec.out_c} channels: only "
            f"groups=1 (direct) and groups=in=out channels (depthwise) map to the CNA; split a "
            f"general grouped conv into per-group convs first")
    if spec.out_h < 1 or spec.out_w < 1:
        raise LoweringError(f"conv output would be empty ({spec.out_h}x{spec.out_w}): {spec}")


@dataclass(frozen=True)
class ConvLayouts:
    input: CubeLayout
    output: CubeLayout
    in_stride: int    # bytes between batch images in the input buffer
    out_stride: int


def conv_layouts(spec: ConvSpec, in_dtype: DType, out_dtype: DType,
                 profile: ChipProfile) -> ConvLayouts:
    """The input and output cubes a direct/depthwise conv reads and writes (per image)."""
    p = profile.input(in_dtype)
    o = profile.output(in_dtype, out_dtype)
    c_pad = round_up(spec.in_c, p.dw_group if spec.depthwise else p.k_align)
    oc_pad = c_pad if spec.depthwise else round_up(spec.out_c, p.n_align)
    # zero rows below a too-short input act as bottom padding (pad value 0)
    h = max(spec.height, profile.min_feature_rows)
    lin = CubeLayout(h, spec.width, c_pad, p.feature_c2, in_dtype.to_numpy())
    lout = CubeLayout(spec.out_h, spec.out_w, oc_pad, o.c2, out_dtype.to_numpy())
    return ConvLayouts(lin, lout, round_up(lin.nbytes, 64), round_up(lout.nbytes, 64))


def conv_shape(spec: ConvSpec, in_dtype: DType, out_dtype: DType, profile: ChipProfile) -> ConvShape:
    lay = conv_layouts(spec, in_dtype, out_dtype, profile)
    (pt, _), (pl, _) = spec.padding
    return ConvShape(in_dtype, out_dtype, spec.depthwise, lay.input.height, spec.width,
                     lay.input.channels, lay.output.channels, spec.kh, spec.kw, spec.stride[0],
                     spec.stride[1], spec.dilation[0], spec.dilation[1], pt, pl, spec.out_h,
                     spec.out_w)
