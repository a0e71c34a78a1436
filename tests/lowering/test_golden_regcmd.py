"""Golden lowering diffs (design.md convention 8): the regcmd words emitted for a fixed set of
small ops must stay byte-identical. A deliberate change regenerates the files with
ROCKJIT_UPDATE_GOLDEN=1 (registered in rockjit/debugflags.py) and is committed with its reason.

The programs themselves are checked elsewhere (test_conv_foreign.py against the hardware-
validated foreign programs, test_matmul_tiled.py / test_conv.py on the simulator); this file
only pins their exact words. Relocations are patched with fixed fake addresses so the files do
not depend on placement."""
from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from golden_testutil import first_difference, render

from rockjit import debugflags
from rockjit.ir.types import DType
from rockjit.lowering.emitters import eltwise as E
from rockjit.lowering.emitters import eltwise_row as ER
from rockjit.lowering.emitters.conv import ConvRequant, ConvSpec, build_conv2d, build_qconv2d
from rockjit.lowering.emitters.lut import build_activation
from rockjit.lowering.emitters.matmul import build_matmul
from rockjit.lowering.emitters.pool import build_global_pool, build_pool
from rockjit.lowering.layouts import feature_layout
from rockjit.lowering.op_lowering import OpLowering
from rockjit.lowering.profile import get_profile

P = get_profile("rk3588")
GOLDEN = Path(__file__).resolve().parent / "golden"
F16, I8, I32 = DType.F16, DType.I8, DType.I32


# fp16 cubes for the element-wise / LUT / pooling ops: ragged channels and a flat view that
# spans more than one EW chunk / flying task is not needed to pin the words, small is enough
CUBE = feature_layout(P, F16, 6, 5, 20)
POOL_CUBE = feature_layout(P, F16, 8, 10, 24)
VEC = np.arange(20, dtype=np.float16)
REQ = ConvRequant(pad_value=-3, ow_op=5, scale=1234, shift=17, offset=-7)

BUILDERS: dict[str, Callable[[], OpLowering]] = {
    "matmul_f16_kacc_16x192x32_kt64_nt16": lambda: build_matmul(
        16, 192, 32, F16, F16, P, b=np.zeros((32, 192), np.float16), max_k=64, max_n=16),
    "matmul_i8_8x128x64_kt64": lambda: build_matmul(
        8, 128, 64, I8, I32, P, b=np.zeros((64, 128), np.int8), max_k=64),
    "matmul_f16_f32_12x64x48": lambda: build_matmul(
        12, 64, 48, F16, DType.F32, P, b=np.zeros((48, 64), np.float16)),
    "conv3x3_s2_p1_f16_64x10x12_to_32": lambda: build_conv2d(
        ConvSpec(1, 64, 10, 12, 32, 3, 3, (2, 2), ((1, 0), (1, 0))), F16, F16, P,
        np.zeros((32, 64, 3, 3), np.float16)),
    "dwconv3x3_s2_p1_f16_64x8x12": lambda: build_conv2d(
        ConvSpec(1, 64, 8, 12, 64, 3, 3, (2, 2), ((1, 0), (1, 0)), groups=64), F16, F16, P,
        np.zeros((64, 1, 3, 3), np.float16)),
    "qconv3x3_i8_requant_16x6x6_to_16": lambda: build_qconv2d(
        ConvSpec(1, 16, 6, 6, 16, 3, 3, (1, 1), ((1, 1), (1, 1))), P,
        np.zeros((16, 16, 3, 3), np.int8), np.arange(16), REQ),
    "qdwconv3x3_i8_requant_32x6x6": lambda: build_qconv2d(
        ConvSpec(1, 32, 6, 6, 32, 3, 3, (1, 1), ((1, 1), (1, 1)), groups=32), P,
        np.zeros((32, 1, 3, 3), np.int8), np.arange(32), REQ),
    "ew_add_6x5x20": lambda: E.build_binary("add", CUBE, P),
    "ew_sub_6x5x20": lambda: E.build_binary("sub", CUBE, P),
    "ew_mul_6x5x20": lambda: E.build_binary("mul", CUBE, P),
    "ew_max_6x5x20": lambda: E.build_binary("max", CUBE, P),
    "flying_scalar_add_6x5x20": lambda: E.build_binary_scalar("add", CUBE, 1.5, profile=P),
    "flying_scalar_mul_6x5x20": lambda: E.build_binary_scalar("mul", CUBE, -0.25, profile=P),
    "flying_scalar_rsub_6x5x20": lambda: E.build_binary_scalar("sub", CUBE, 2.0, True, P),
    "ew_channel_min_6x5x20": lambda: E.build_binary_channel("min", CUBE, VEC, profile=P),
    "ew_channel_rsub_6x5x20": lambda: E.build_binary_channel("sub", CUBE, VEC, True, P),
    "ew_row_mul_6x5x20": lambda: ER.build_binary_row("mul", CUBE, profile=P),
    "lut_sigmoid_6x5x20": lambda: build_activation("sigmoid", CUBE, (-4.0, 4.0), P),
    "lut_gelu_tanh_6x5x20": lambda: build_activation("gelu_tanh", CUBE, (-6.0, 6.0), P),
    "pool_max2x2_8x10x24": lambda: build_pool("max", POOL_CUBE, (2, 2), profile=P),
    "pool_avg3x3_s2_p1_8x10x24": lambda: build_pool("avg", POOL_CUBE, (3, 3), (2, 2),
                                                     (1, 1, 1, 1), P),
    "pool_global_mean_8x10x24": lambda: build_global_pool("avg", POOL_CUBE, P),
}


@cache
def _op(name: str) -> OpLowering:
    return BUILDERS[name]()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_golden_regcmd(name: str) -> None:
    got = render(_op(name))
    path = GOLDEN / f"{name}.txt"
    if debugflags.enabled("ROCKJIT_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
        pytest.skip(reason=f"ROCKJIT_UPDATE_GOLDEN is set: rewrote {path.name}; commit it with the reason")
    assert path.exists(), (f"no golden file {path}; generate it deliberately with "
                           f"ROCKJIT_UPDATE_GOLDEN=1 and review it")
    want = path.read_text()
    assert got == want, (f"{name}: emitted regcmd differs from {path.name} -- "
                         f"{first_difference(want, got)}\nIf the change is deliberate, rerun with "
                         f"ROCKJIT_UPDATE_GOLDEN=1 and commit the new file with the reason.")


def test_golden_comparison_can_fail() -> None:
    text = render(_op("conv3x3_s2_p1_f16_64x10x12_to_32"))
    changed = text.replace("CNA_PAD_CON0", "CNA_PAD_CON0 ", 1)
    assert changed != text and "line" in first_difference(text, changed)


def test_update_flag_is_registered() -> None:
    names = {f.name for f in debugflags.registered()}
    assert "ROCKJIT_UPDATE_GOLDEN" in names
    with pytest.raises(debugflags.FlagError):
        debugflags.value("ROCKJIT_NO_SUCH_FLAG")
