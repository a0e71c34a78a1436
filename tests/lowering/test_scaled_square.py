"""The one-pass scaled square (x 2^-s)^2 (emitters/eltwise.build_scaled_square) on the
simulator against numpy, and a LayerNorm whose first statistics pass it runs, against JAX."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import rockjit
from models import layers as L
from rockjit.cost import program_of
from rockjit.ir.types import DType
from rockjit.lowering.emitters.eltwise import build_scaled_square
from rockjit.lowering.layouts import feature_layout
from rockjit.lowering.regcmd import LoweringError

from test_eltwise_harness import P, needs_sim, run_program

F16 = DType.F16


def exact_square(x: np.ndarray, shift: int) -> np.ndarray:
    """fp16 of the exact (x 2^-shift)^2: float64 holds it exactly (22-bit significand)."""
    with np.errstate(over="ignore"):
        return (x.astype(np.float64) ** 2 * 4.0 ** -shift).astype(np.float16)


@needs_sim
@pytest.mark.parametrize("shape,shift", [((37, 1, 45), 1), ((250, 1, 136), 8), ((1030, 1, 40), 14)])
def test_scaled_square_is_one_rounding(shape, shift) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((shape, shift)).encode()))
    lay = feature_layout(P, F16, *shape)
    # magnitudes from fp16's subnormals to where the square nears fp16's top: the two-pass
    # form rounds a subnormal x 2^-s first, the one-pass form only once
    top = min(7.9, 15.9 - shift)         # x itself stays a finite fp16
    x = (rng.choice([-1.0, 1.0], shape) * 2.0 ** (rng.uniform(-20, top, shape) + shift))
    x = x.astype(np.float16)
    assert np.isfinite(x).all()
    prog = build_scaled_square(lay, shift, P)
    assert prog.macs == 0 and prog.buffer("a").nbytes == prog.buffer("b").nbytes
    packed = lay.pack(x)
    mem = run_program(prog, {"a": packed, "b": packed})
    got = lay.unpack(mem["out"])
    ref = exact_square(x, shift)
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16)), \
        f"{int((got != ref).sum())} of {x.size} differ from fp16((x 2^-{shift})^2)"
    # where x 2^-s is a normal fp16 the two-pass form gives the same bits
    v = (x.astype(np.float32) * np.float32(2.0 ** -shift)).astype(np.float16)
    normal = np.abs(v) >= 2.0 ** -14
    two_pass = (v.astype(np.float32) * v.astype(np.float32)).astype(np.float16)
    assert normal.sum() > x.size // 2
    assert np.array_equal(got[normal], two_pass[normal])


def test_scaled_square_refuses_a_subnormal_factor() -> None:
    with pytest.raises(LoweringError, match="normal fp16"):
        build_scaled_square(feature_layout(P, F16, 16, 1, 32), 15, P)


def _layer_norm(p, x):
    return L.layer_norm(x, p["g"], p["b"], 1e-6)


def test_layer_norm_runs_its_first_square_from_x_on_the_simulator() -> None:
    """A residual stream in the hundreds (the range plan prescales x by 2^-s before squaring):
    the prescale is not computed, the square reads x, and the norm matches float64 numpy."""
    rng = np.random.default_rng(5)
    t, h = 40, 96
    x = (rng.standard_normal((t, h)) * 60 + rng.standard_normal((t, 1)) * 300).astype(np.float32)
    p = {"g": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
         "b": (0.1 * rng.standard_normal(h)).astype(np.float32)}
    f = rockjit.compile(_layer_norm, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    xd = x.astype(np.float64)
    c = xd - xd.mean(-1, keepdims=True)
    ref = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6) * p["g"] + p["b"]
    assert np.abs(got - ref).max() < 4e-3 * np.abs(ref).max()
    decisions = program_of(f.compiled(p, x)).lowered.decisions
    assert any(d.how == "eltwise.build_scaled_square" for d in decisions)
    assert any("one-pass square" in d.how for d in decisions)
