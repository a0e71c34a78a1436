"""Conv lowerings (direct, depthwise, conv1d, im2col patchify) on the simulator, table-driven.

The numpy reference is an independent im2col written here: ref = cols . W^T in float64/int64,
and the fp16 tolerance is tolerance.matmul_bound over those same cols (a conv *is* that matmul),
so the one tolerance rule applies unchanged. int8 is bit-exact. Strict mode is on."""
from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.conv import ConvSpec, build_conv2d
from rockjit.lowering.emitters.patchify import choose_patchify
from rockjit.lowering.op_lowering import HostStep
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import LoweringError
from rockjit.lowering.tile_choice import plan_conv
from rockjit.lowering.emitters.conv import conv_shape

from op_lowering_sim import MISSING, run_conv

P = get_profile("rk3588")
F16, F32, I8, I32 = DType.F16, DType.F32, DType.I8, DType.I32
sim = pytest.mark.skipif(bool(MISSING), reason=MISSING or "simulator available")


def im2col(x: np.ndarray, spec: ConvSpec) -> np.ndarray:
    """[N, C, H, W] -> [N, OH*OW, C, KH*KW] (zeros in the padding)."""
    (pt, pb), (pl, pr) = spec.padding
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    (sy, sx), (dy, dx) = spec.stride, spec.dilation
    oh, ow = spec.out_h, spec.out_w
    cols = np.empty(x.shape[:2] + (oh, ow, spec.kh, spec.kw), x.dtype)
    for ky in range(spec.kh):
        for kx in range(spec.kw):
            cols[:, :, :, :, ky, kx] = xp[:, :, ky * dy:ky * dy + (oh - 1) * sy + 1:sy,
                                          kx * dx:kx * dx + (ow - 1) * sx + 1:sx]
    return cols.transpose(0, 2, 3, 1, 4, 5).reshape(x.shape[0], oh * ow, x.shape[1], spec.kh * spec.kw)


def reference(x: np.ndarray, w: np.ndarray, spec: ConvSpec, integer: bool, fp16_out: bool = True):
    """(ref [N, OC, OH, OW], bound or None)."""
    acc = np.int64 if integer else np.float64
    cols = im2col(x, spec).astype(acc)                       # [N, P, C, T]
    n, p = cols.shape[:2]
    if spec.depthwise:
        a = cols.transpose(0, 2, 1, 3)                       # [N, C, P, T]
        b = w.reshape(spec.out_c, 1, -1).astype(acc)         # [C, 1, T]
        ref = (a @ np.swapaxes(b, -1, -2))[..., 0]           # [N, C, P]
        bnd = None if integer else T.matmul_bound(a, np.broadcast_to(b, (n,) + b.shape), fp16_out)[..., 0]
    else:
        a = cols.reshape(n, p, -1)
        b = w.reshape(spec.out_c, -1).astype(acc)
        ref = np.swapaxes(a @ b.T, 1, 2)
        bnd = None if integer else np.swapaxes(
            T.matmul_bound(a, np.broadcast_to(b, (n,) + b.shape), fp16_out), 1, 2)
    shp = (n, spec.out_c, spec.out_h, spec.out_w)
    return ref.reshape(shp), (None if bnd is None else bnd.reshape(shp))


class CV(NamedTuple):
    why: str
    spec: ConvSpec
    i: DType = F16
    o: DType = F16
    caps: dict | None = None
    conv1d: bool = False
    route: str = "auto"


def S(c, h, w, oc, kh, kw, stride=(1, 1), pad=((0, 0), (0, 0)), dil=(1, 1), groups=1, batch=1):
    return ConvSpec(batch, c, h, w, oc, kh, kw, stride, pad, dil, groups)


OPS = [
    CV("1x1", S(32, 8, 8, 16, 1, 1)),
    CV("3x3 s1 p1", S(16, 8, 8, 16, 3, 3, pad=((1, 1), (1, 1)))),
    CV("3x3 s2 p1 (conformance 04 shape)", S(64, 10, 12, 32, 3, 3, (2, 2), ((1, 1), (1, 1)))),
    CV("asymmetric padding", S(24, 9, 11, 16, 3, 3, (2, 2), ((1, 0), (0, 1)))),
    CV("RGB 5x5 p2 (IC=3 padded to 32)", S(3, 16, 16, 24, 5, 5, pad=((2, 2), (2, 2)))),
    CV("dilation 2", S(16, 12, 12, 16, 3, 3, pad=((2, 2), (2, 2)), dil=(2, 2))),
    CV("mixed stride/dilation/padding", S(16, 13, 9, 24, 3, 2, (2, 1), ((2, 0), (0, 1)), (2, 1))),
    CV("1x7 kernel", S(32, 6, 20, 32, 1, 7, pad=((0, 0), (3, 3)))),
    CV("7x7 s2 p3 stem", S(3, 32, 32, 64, 7, 7, (2, 2), ((3, 3), (3, 3)))),
    CV("forced rows x kernels x channels tiling", S(40, 30, 17, 48, 3, 3, pad=((1, 1), (1, 1))),
       caps=dict(max_rows=7, max_kernels=16, max_channels=32)),
    CV("batch 2, OC=20", S(40, 9, 11, 20, 3, 3, pad=((1, 1), (1, 1)), batch=2)),
    CV("image shorter than 4 rows", S(3, 2, 3, 16, 3, 3, pad=((1, 1), (1, 1)))),
    CV("rows past one task (1500 rows)", S(32, 1500, 4, 32, 3, 3, pad=((1, 1), (1, 1)))),
    CV("K split on the DPU (IC=512)", S(512, 8, 8, 32, 3, 3, pad=((1, 1), (1, 1))),
       caps=dict(max_channels=128)),
    CV("fp32 out", S(16, 8, 8, 16, 3, 3, pad=((1, 1), (1, 1))), o=F32),
    CV("depthwise 3x3 s2 p1 (conformance 09 shape)",
       S(64, 8, 12, 64, 3, 3, (2, 2), ((1, 1), (1, 1)), groups=64)),
    CV("depthwise C=48 (padded to 64)", S(48, 10, 10, 48, 3, 3, pad=((1, 1), (1, 1)), groups=48)),
    CV("depthwise 5x5, row tiles", S(48, 20, 10, 48, 5, 5, pad=((2, 2), (2, 2)), groups=48),
       caps=dict(max_rows=6)),
    CV("depthwise channel tiles", S(96, 16, 16, 96, 3, 3, pad=((1, 1), (1, 1)), groups=96),
       caps=dict(max_kernels=32)),
    CV("depthwise dilation 2", S(32, 12, 12, 32, 3, 3, pad=((2, 2), (2, 2)), dil=(2, 2), groups=32)),
    CV("conv1d Whisper conv1 80->384 k3 over 3000 frames", S(80, 3000, 1, 384, 3, 1, pad=((1, 1), (0, 0))),
       conv1d=True),
    CV("conv1d Whisper conv2 384->384 k3 s2", S(384, 3000, 1, 384, 3, 1, (2, 1), ((1, 1), (0, 0))),
       conv1d=True),
    CV("conv1d k5 dilation 2", S(24, 50, 1, 40, 5, 1, pad=((4, 4), (0, 0)), dil=(2, 1)), conv1d=True),
    CV("patchify SigLIP-B/16 3x512x512 -> 768 (im2col)", S(3, 512, 512, 768, 16, 16, (16, 16))),
    CV("patchify 2x2/2 on 64 channels (direct by the cost rule)", S(64, 8, 8, 32, 2, 2, (2, 2))),
    CV("patchify 4x4/4 forced direct", S(3, 32, 32, 32, 4, 4, (4, 4)), route="direct"),
    CV("patchify, 2 images", S(3, 32, 48, 40, 16, 16, (16, 16), batch=2)),
    CV("stride 10x1 past the 3-bit field, padded (im2col)",
       S(16, 40, 11, 24, 1, 3, (10, 1), ((2, 2), (3, 3)), batch=2)),
    CV("stride 1x11, dilation 3x1, KW=11 (im2col, patches + pack)",
       S(20, 15, 33, 17, 2, 11, (1, 11), ((3, 3), (1, 1)), (3, 1))),
    CV("stride 9x9, KW=16 (im2col, one rank-7 copy, overlapping windows)",
       S(8, 30, 40, 16, 12, 16, (9, 9), ((1, 1), (0, 2)))),
    CV("conv1d geometry (W=1) stride 13 dilation 2 (im2col)",
       S(5, 200, 1, 40, 4, 1, (13, 1), ((3, 3), (0, 0)), (2, 1))),
    CV("input 3000 wide, past one task's columns (im2col fallback)", S(16, 4, 3000, 16, 1, 3)),
    CV("dilated 15x3 kernel, no CBUF tile (im2col fallback)",
       S(4, 41, 511, 2, 15, 3, (2, 2), ((1, 1), (1, 1)), (3, 1))),
    CV("int8 3x3 p1, host K sum", S(40, 30, 17, 48, 3, 3, pad=((1, 1), (1, 1))), I8, I32,
       caps=dict(max_rows=7, max_channels=32)),
    CV("int8 1x1", S(64, 6, 6, 64, 1, 1), I8, I32),
    CV("int8 conv1d s2", S(80, 200, 1, 64, 3, 1, (2, 1), ((1, 1), (0, 0))), I8, I32, conv1d=True),
]


def _data(op: CV, rng):
    s = op.spec
    xs = (s.batch, s.in_c, s.height, s.width)
    ws = (s.out_c, 1 if s.depthwise else s.in_c, s.kh, s.kw)
    if op.i == I8:
        return (rng.integers(-128, 127, xs, endpoint=True).astype(np.int8),
                rng.integers(-128, 127, ws, endpoint=True).astype(np.int8))
    return rng.standard_normal(xs).astype(np.float16), rng.standard_normal(ws).astype(np.float16)


@sim
@pytest.mark.parametrize("op", OPS, ids=[o.why for o in OPS])
def test_conv_on_simulator(op: CV) -> None:
    rng = np.random.default_rng(zlib.crc32(op.why.encode()))
    x, w = _data(op, rng)
    s = op.spec
    # a conv1d is the conv2d with time on the rows and width 1 (rules/conv.py builds it so)
    route = "direct" if op.conv1d else op.route
    prog = build_conv2d(s, op.i, op.o, P, w, patchify=route, **(op.caps or {}))
    got, run = run_conv(prog, x)
    ref, bnd = reference(x, w, s, op.i == I8, fp16_out=op.o == F16)
    if op.i == I8:
        assert got.dtype == np.int32 and np.array_equal(got, ref)
    else:
        assert got.dtype == op.o.to_numpy()
        T.check(got, ref, bnd, op.why)


def test_patchify_cost_rule() -> None:
    siglip = S(3, 512, 512, 768, 16, 16, (16, 16))
    assert choose_patchify(siglip, F16, P) == "im2col"          # 32*256 = 8192 > 768 MACs/output
    assert choose_patchify(S(64, 8, 8, 32, 2, 2, (2, 2)), F16, P) == "direct"   # 256 == 256
    assert choose_patchify(S(3, 32, 32, 8, 3, 3, (1, 1)), F16, P) == "direct"   # overlapping
    prog = build_conv2d(siglip, F16, F16, P, np.zeros((768, 3, 16, 16), np.float16))
    # the im2col is one strided copy of the generic host-op library (KW=16 is two C2 atoms)
    assert isinstance(prog.steps[0], HostStep) and prog.steps[0].kind == "copy"
    assert prog.buffer("x").layout is None                       # row-major pixels in


def test_conv1d_puts_time_on_the_rows() -> None:
    spec = S(80, 3000, 1, 384, 3, 1, pad=((1, 1), (0, 0)))
    prog = build_conv2d(spec, F16, F16, P, np.zeros((384, 80, 3, 1), np.float16), patchify="direct")
    lx = prog.buffer("x").layout
    assert (lx.height, lx.width) == (3000, 1)
    plan = plan_conv(conv_shape(spec, F16, F16, P), P)
    assert len(plan.rows) > 1 and all(r.in_rows <= P.max_feature_rows for r in plan.rows)
    # consecutive row tiles overlap by the kernel halo
    assert all(b.in_row <= a.in_row + a.in_rows - 2 for a, b in zip(plan.rows, plan.rows[1:]))


def test_refusals_say_what_to_do() -> None:
    with pytest.raises(LoweringError, match="depthwise-conv.md"):
        build_conv2d(S(32, 8, 8, 32, 3, 3, groups=32), I8, I32, P, np.zeros((32, 1, 3, 3), np.int8))
    with pytest.raises(LoweringError, match="time on the rows"):
        build_conv2d(S(16, 4, 3000, 16, 1, 3), F16, F16, P, np.zeros((16, 16, 1, 3), np.float16),
                     patchify="direct")
    with pytest.raises(LoweringError, match="grouped conv"):
        build_conv2d(S(32, 8, 8, 64, 3, 3, groups=2), F16, F16, P, np.zeros((64, 16, 3, 3), np.float16))
    with pytest.raises(LoweringError, match=r"OIHW"):
        build_conv2d(S(32, 8, 8, 16, 3, 3), F16, F16, P, np.zeros((16, 32, 3, 2), np.float16))
    with pytest.raises(LoweringError, match="CONV_Y_STRIDE"):
        build_conv2d(S(3, 32, 32, 8, 16, 16, (16, 16)), F16, F16, P,
                     np.zeros((8, 3, 16, 16), np.float16), patchify="direct")
    with pytest.raises(LoweringError, match="only an ungrouped conv has the im2col"):
        build_conv2d(S(16, 20, 20, 16, 3, 3, (8, 1), groups=16), F16, F16, P,
                     np.zeros((16, 1, 3, 3), np.float16))
    with pytest.raises(LoweringError, match="PAD_LEFT"):
        build_conv2d(S(16, 8, 40, 16, 33, 33, pad=((16, 16), (16, 16))), F16, F16, P,
                     np.zeros((16, 16, 33, 33), np.float16), patchify="direct")
