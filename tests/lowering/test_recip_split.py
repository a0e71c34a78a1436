"""The host op RJ_UN_RECIP_LO (csrc/runtime/host_ops.c): the low fp16 part of 1/s split into
two fp16 (a deferred softmax's row scale, rules/eltwise_vectors.deferred_division_calls), bit
for bit against numpy's f32 arithmetic of the four steps it replaced."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering.host_rules import HostView
from rockjit.runtime.errors import ProgramError
from rockjit.runtime.host_abi import UNARY

from host_ops_testutil import run_desc

F32, F16 = DType.F32, DType.F16


def _split_ref(s: np.ndarray, shift: int) -> np.ndarray:
    """lo of the replaced steps: t = 1 / s; h = f32(f16(t)); d = t - h; fp16(d * 2^shift)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.float32(1.0) / s
        h = t.astype(np.float16).astype(np.float32)
        return ((t - h) * np.float32(2.0 ** shift)).astype(np.float16)


@pytest.mark.parametrize("shift", [12, 0, 20])
def test_recip_lo_bit_for_bit(shift) -> None:
    rng = np.random.default_rng(shift)
    # row sums of a softmax (1 .. keys) and beyond: tiny, huge, negative, one, zero, inf
    s = (rng.choice([-1.0, 1.0], 4000) * 2.0 ** rng.uniform(-20, 20, 4000)).astype(np.float32)
    s[:6] = [1.0, 0.0, np.inf, 3.0, 1500.0, 2.0 ** -30]
    out = np.full((s.size, 2), 7.0, np.float16)   # lo into channel 1 of each row, as the rule
    run_desc("unary", (s.size,), out, HostView("o", F16, 1, (2,)),
             [(s, HostView("s", F32, 0, (1,)))], code=UNARY["recip_lo"], iparams=(shift,))
    ref = _split_ref(s, shift)
    same = (out[:, 1].view(np.uint16) == ref.view(np.uint16)) | (np.isnan(out[:, 1]) &
                                                                 np.isnan(ref))
    assert same.all(), f"{int((~same).sum())} differ, first at s = {s[~same][:3]}"
    assert (out[:, 0] == 7.0).all()             # channel 0 (hi) untouched
    # where t is a normal f16, hi + lo * 2^-shift recovers 1/s far past f16's precision
    t = np.float32(1.0) / s[6:]
    with np.errstate(over="ignore"):
        hi = t.astype(np.float16)
    normal = (np.abs(hi) >= 2.0 ** -14) & np.isfinite(hi)
    if shift == 12:
        rec = hi[normal].astype(np.float64) + out[6:, 1][normal].astype(np.float64) * 2.0 ** -12
        assert np.all(np.abs(rec - t[normal]) <= np.abs(t[normal]) * 2.0 ** -20)


def test_recip_lo_needs_a_float_input() -> None:
    s = np.arange(1, 9, dtype=np.int32)
    out = np.zeros(8, np.float16)
    with pytest.raises(ProgramError, match="float input"):
        run_desc("unary", (8,), out, HostView("o", F16, 0, (1,)),
                 [(s, HostView("s", DType.I32, 0, (1,)))], code=UNARY["recip_lo"], iparams=(12,))
