"""PPU pooling emitters on the simulator (strict) vs numpy, and conformance 07/08 word by word."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.pool import (global_pool_plan, build_global_pool, build_pool,
                                            pool_output_layout)
from rockjit.lowering.layouts import feature_layout
from rockjit.lowering.regcmd import LoweringError

from test_eltwise_harness import (P, assert_register_agreement, case_addresses, needs_sim,
                                  run_program)

# Our pool tasks must equal the foreign ones field for field: no listed difference.
DIFF_07: dict[tuple[str, str], str] = {}
DIFF_08: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("prefix,method,shape,kernel,stride,allowed", [
    ("07", "max", (10, 12, 24), (3, 3), (2, 2), DIFF_07),
    ("08", "avg", (6, 6, 8), (3, 3), (1, 1), DIFF_08)])
def test_conformance_words(prefix, method, shape, kernel, stride, allowed) -> None:
    prog = build_pool(method, feature_layout(P, DType.F16, *shape), kernel, stride, profile=P)
    kick = prog.steps[0].jobs[0].kicks[0]
    a = case_addresses(prefix)
    words = kick.array({"x": a["input"], "out": a["output"], "regcmd": a["regcmd"]})
    assert_register_agreement(words, prefix, allowed)


def ref_pool(x: np.ndarray, method: str, k, s, pad) -> np.ndarray:
    """Direct float64 pooling over [H, W, C]; avg divides by kh*kw (count-include-pad)."""
    kh, kw = k
    sh, sw = s
    pt, pl, pb, pr = pad
    h, w, c = x.shape
    fill = -np.inf if method == "max" else 0.0
    xp = np.full((h + pt + pb, w + pl + pr, c), fill)
    xp[pt:pt + h, pl:pl + w] = x
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    out = np.empty((oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            win = xp[i * sh:i * sh + kh, j * sw:j * sw + kw]
            out[i, j] = win.max((0, 1)) if method == "max" else win.sum((0, 1)) / (kh * kw)
    return out


RECORDS = [
    ("max", (1, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),          # minimal
    ("max", (2, 2, 1), (2, 2), (2, 2), (0, 0, 0, 0)),
    ("avg", (2, 2, 3), (2, 2), (1, 1), (0, 0, 0, 0)),
    ("max", (10, 12, 24), (3, 3), (2, 2), (0, 0, 0, 0)),      # conformance 07's shape
    ("avg", (6, 6, 8), (3, 3), (1, 1), (0, 0, 0, 0)),         # conformance 08's shape
    ("max", (7, 9, 5), (3, 3), (1, 1), (1, 1, 1, 1)),         # padded max (-inf fill)
    ("avg", (7, 9, 5), (3, 3), (2, 2), (1, 1, 1, 1)),         # padded avg: count-include-pad
    ("max", (1, 17, 19), (1, 3), (1, 2), (0, 0, 0, 0)),       # one row
    ("avg", (1, 16, 9), (1, 4), (1, 4), (0, 0, 0, 0)),        # 1 x k average (geometric recip)
    ("avg", (9, 9, 33), (2, 3), (2, 3), (0, 0, 0, 0)),        # asymmetric
    ("max", (16, 16, 8), (16, 16), (16, 16), (0, 0, 0, 0)),   # the largest kernel
    ("avg", (14, 14, 130), (7, 7), (7, 7), (0, 0, 0, 0)),     # C % 8 != 0
    ("max", (15, 11, 40), (5, 3), (3, 4), (2, 1, 0, 2)),
    ("min", (8, 8, 16), (2, 2), (2, 2), (0, 0, 0, 0)),
    ("avg", (56, 56, 64), (2, 2), (2, 2), (0, 0, 0, 0)),
]


@needs_sim
@pytest.mark.parametrize("method,shape,k,s,pad", RECORDS,
                         ids=[f"{m}-{'x'.join(map(str, sh))}-k{k[0]}{k[1]}" for m, sh, k, s, pad in RECORDS])
def test_pool(method, shape, k, s, pad) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((method, shape, k, pad)).encode()))
    lay = feature_layout(P, DType.F16, *shape)
    x = rng.uniform(-6, 6, shape).astype(np.float16)
    prog = build_pool(method, lay, k, s, pad, P)
    out = pool_output_layout(lay, k, s, pad, P)
    got = out.unpack(run_program(prog, {"x": lay.pack(x)})["out"])
    if method == "min":
        ref = -ref_pool(-x.astype(np.float64), "max", k, s, pad)
    else:
        ref = ref_pool(x.astype(np.float64), method, k, s, pad)
    if method in ("max", "min"):
        assert np.array_equal(got.astype(np.float64), ref), "max/min select inputs: exact"
    else:
        # two fp16 reciprocals (each within 2^-11 relative of 65536/k) and the output rounding;
        # the window sum is exact enough in the PPU's accumulator
        mag = np.abs(ref)
        T.check(got, ref, T.elementwise_bound(ref, mag, mag, rounds=1) + 1e-6, f"avg {shape}")


GLOBAL_RECORDS = [("avg", (4, 4, 8)), ("max", (7, 7, 3)), ("avg", (14, 14, 130)),
                  ("avg", (28, 20, 16)), ("max", (56, 56, 20)), ("avg", (32, 32, 8)),
                  ("min", (16, 64, 8))]


@needs_sim
@pytest.mark.parametrize("method,shape", GLOBAL_RECORDS)
def test_global_pool(method, shape) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((method, shape)).encode()))
    lay = feature_layout(P, DType.F16, *shape)
    x = rng.uniform(-4, 4, shape).astype(np.float16)
    prog = build_global_pool(method, lay, P)
    got = feature_layout(P, DType.F16, 1, 1, shape[2]).unpack(
        run_program(prog, {"x": lay.pack(x)})["out"])[0, 0].astype(np.float64)
    x64 = x.astype(np.float64)
    if method == "max":
        assert np.array_equal(got, x64.max((0, 1)))
    elif method == "min":
        assert np.array_equal(got, x64.min((0, 1)))
    else:
        ref = x64.mean((0, 1))
        passes = len(global_pool_plan(shape[0], shape[1]))
        # per pass: two reciprocal roundings and an fp16 output rounding, on values bounded by
        # the input magnitude
        bound = passes * 3 * T.U16 * np.abs(x64).max() + T.FLOOR
        T.check(got, ref, bound, f"global avg {shape}")


def test_plans_and_refusals() -> None:
    assert global_pool_plan(56, 56) == [(7, 7), (8, 8)]
    assert global_pool_plan(7, 7) == [(7, 7)]
    assert all(kh * kw > 1 for kh, kw in global_pool_plan(28, 20))
    with pytest.raises(LoweringError, match="prime factor above 16"):
        global_pool_plan(17, 17)
    with pytest.raises(LoweringError, match="under 4"):
        global_pool_plan(1500, 1)
    lay = feature_layout(P, DType.F16, 8, 8, 8)
    with pytest.raises(LoweringError, match="outside"):
        build_pool("max", lay, (17, 1), profile=P)
    with pytest.raises(LoweringError, match="identity"):
        build_pool("avg", lay, (1, 1), profile=P)
    with pytest.raises(LoweringError, match="not one of"):
        build_pool("sum", lay, (2, 2), profile=P)
