"""A matmul's epilogue in its own tasks (issue 9, emitter level): C = A.B^T + bias[N] through the
EW stage (a resident broadcast bias cube read by ERDMA), or C = act(A.B^T) through the LUT, run
on the simulator against numpy. The pipeline uses the bias form for matmul_epilogue{bias}
(rules/contract.py; tests/lowering/test_matmul_epilogue_graph.py)."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.lut import activation_error, activation_reference, activation_table
from rockjit.lowering.emitters.matmul import MatmulEpilogue, build_matmul
from rockjit.lowering.emitters.task import DpuStages
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import LoweringError

from op_lowering_sim import MISSING, run_matmul

P = get_profile("rk3588")
F16 = DType.F16
sim = pytest.mark.skipif(bool(MISSING), reason=MISSING or "simulator available")


def _ab(m: int, k: int, n: int, seed: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * scale).astype(np.float16)
    b = (rng.standard_normal((n, k)) * scale).astype(np.float16)
    return a, b


@sim
@pytest.mark.parametrize("m,k,n,caps", [
    (13, 100, 50, {}),                                   # one tile, ragged everything
    (100, 96, 90, {"max_m": 32, "max_n": 32}),           # M and N tiles, a 4-row tail tile
    (37, 300, 90, {"max_k": 96, "max_n": 32}),           # K steps: the bias rides the first
    (196, 768, 768, {}),                                  # SigLIP-224's projection plan (4 K steps)
])
def test_bias_epilogue_on_simulator(m, k, n, caps) -> None:
    a, b = _ab(m, k, n, m * 31 + n)
    bias = (np.random.default_rng(n).standard_normal(n) * 4).astype(np.float16)
    prog = build_matmul(m, k, n, F16, F16, P, b=b, epilogue=MatmulEpilogue(bias=bias), **caps)
    # no separate pass: every task is a matmul tile
    plain = build_matmul(m, k, n, F16, F16, P, b=b, **caps)
    assert sum(len(kk.task_offsets) for j in prog.jobs() for kk in j.kicks) == \
        sum(len(kk.task_offsets) for j in plain.jobs() for kk in j.kicks)
    got, _ = run_matmul(prog, a)
    mm = a.astype(np.float64) @ b.astype(np.float64).T
    ref = mm + bias.astype(np.float64)
    # the add happens in fp32 before the one fp16 rounding of the output
    bnd = T.matmul_bound(a, b, fp16_out=False) + np.abs(ref) * 2.0 ** -11 + T.FLOOR
    T.check(got, ref, bnd, f"matmul + bias {m}x{k}x{n}")


@sim
@pytest.mark.parametrize("m,k,n,caps", [(37, 64, 48, {}), (100, 64, 90, {"max_m": 32, "max_n": 32})])
def test_lut_epilogue_on_simulator(m, k, n, caps) -> None:
    # a single-table activation (sigmoid); gated (gelu, silu) and affine (tanh) kinds need a
    # second pass whatever the epilogue
    kind, lo, hi = "sigmoid", -8.0, 8.0
    a, b = _ab(m, k, n, m + n, scale=0.25)               # |A.B^T| well inside the domain
    t = activation_table(kind, (lo, hi))
    act = DpuStages(bn=t.bn, lut=t.lut, out_cvt=t.out_cvt)
    prog = build_matmul(m, k, n, F16, F16, P, b=b, epilogue=MatmulEpilogue(act=act), **caps)
    got, _ = run_matmul(prog, a)
    x = a.astype(np.float64) @ b.astype(np.float64).T
    assert lo < x.min() and x.max() < hi
    ref = activation_reference(kind, x)
    # the table's own error plus the matmul's (fp32 accumulation) through a slope <= 1
    bnd = T.lut_bound(ref, activation_error(kind, x, (lo, hi))) + T.matmul_bound(a, b, fp16_out=False)
    T.check(got.astype(np.float64), ref, bnd, f"{kind}(A.B^T)")


def test_epilogue_refusals_say_why() -> None:
    a, b = _ab(16, 64, 16, 1)
    t = activation_table("sigmoid", (-8.0, 8.0))
    both = MatmulEpilogue(bias=np.zeros(16), act=DpuStages(bn=t.bn, lut=t.lut, out_cvt=t.out_cvt))
    with pytest.raises(LoweringError, match="undocumented"):
        build_matmul(16, 64, 16, F16, F16, P, b=b, epilogue=both)
    # an EW operand under the ERDMA's 12-position surface-stride floor (k-accumulation.md)
    with pytest.raises(LoweringError, match="12 positions"):
        build_matmul(8, 64, 16, F16, F16, P, b=b, epilogue=MatmulEpilogue(bias=np.zeros(16)))
    with pytest.raises(LoweringError, match="K steps"):
        build_matmul(8, 128, 16, F16, F16, P, b=np.zeros((16, 128), np.float16), max_k=64,
                     epilogue=MatmulEpilogue(act=both.act))
    with pytest.raises(LoweringError, match=r"bias must be \[16\]"):
        build_matmul(8, 64, 16, F16, F16, P, b=b, epilogue=MatmulEpilogue(bias=np.zeros(15)))
