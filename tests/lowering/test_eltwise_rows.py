"""Element-wise passes split by rows (emitters/eltwise_rows.py): each job a row range over
every channel plane, as flying DPU tasks (the two-operand one through ERDMA), on the strict
simulator against numpy's fp32 operation rounded once to fp16 -- bit for bit, as the flat and
one-pass forms compute -- at row counts that do not divide by 3 and a channel count that
leaves a partial plane; and the jobs touch only their own rows of each plane."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering.emitters import eltwise_rows as R
from rockjit.lowering.emitters.eltwise_row import pack_row_vector
from rockjit.lowering.layouts import feature_layout
from test_eltwise_harness import P, needs_sim, run_program

F32 = {"mul": np.multiply, "add": np.add, "max": np.maximum, "min": np.minimum,
       "sub": np.subtract}


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    bad = got.view(np.uint16) != ref.view(np.uint16)
    assert not bad.any(), f"{what}: {int(bad.sum())} lanes differ, first at {np.argwhere(bad)[0]}"


@needs_sim
@pytest.mark.parametrize("t,h", [(197, 768), (50, 44)])
def test_row_split_passes_match_numpy_bit_for_bit(t: int, h: int) -> None:
    lay = feature_layout(P, DType.F16, t, 1, h)
    cuts = R.row_cuts(t, P)
    assert len(cuts) == 2 and all(c % P.row_align == 0 for c in cuts)
    rng = np.random.default_rng(t)
    a = (rng.standard_normal((t, 1, h)) * 8).astype(np.float16)
    b = (rng.standard_normal((t, 1, h)) * 8).astype(np.float16)
    s = (rng.standard_normal(t) * 8).astype(np.float16)
    a32, b32, s32 = a.astype(np.float32), b.astype(np.float32), s.astype(np.float32)[:, None, None]
    for op in ("mul", "add", "max", "min"):
        run = run_program(R.build_binary_rows(op, lay, P, cuts),
                          {"a": lay.pack(a), "b": lay.pack(b)})
        _same(lay.unpack(run["out"]), F32[op](a32, b32).astype(np.float16), f"a {op} b")
    run = run_program(R.build_scalar_rows("mul", lay, 2.0 ** -3, False, P, cuts),
                      {"x": lay.pack(a)})
    _same(lay.unpack(run["out"]), (a32 * 2.0 ** -3).astype(np.float16), "x * 2^-3")
    for op in ("sub", "mul", "add"):
        run = run_program(R.build_row_rows(op, lay, P, cuts),
                          {"x": lay.pack(a), "s": pack_row_vector(s, P)})
        _same(lay.unpack(run["out"]), F32[op](a32, s32).astype(np.float16), f"x {op} s[row]")


def test_each_job_touches_only_its_rows() -> None:
    t, h = 197, 64
    lay = feature_layout(P, DType.F16, t, 1, h)
    cuts = R.row_cuts(t, P)
    prog = R.build_binary_rows("mul", lay, P, cuts)
    jobs = prog.steps[0].jobs
    assert len(jobs) == 3
    plane = lay.surf_stride
    for job, (r0, r1) in zip(jobs, zip((0, *cuts), (*cuts, t))):
        for k in job.kicks:
            for acc in (*k.reads, *k.writes):
                lo = acc.offset % plane // P.atom_bytes
                assert r0 <= lo and lo + acc.nbytes // P.atom_bytes <= r1, (acc, r0, r1)


@needs_sim
@pytest.mark.parametrize("real", [40, 44])
def test_per_row_ops_leave_a_padded_cubes_padding_alone(real: int) -> None:
    """A value of ``real`` channels in a cube padded to 64 (for a consumer's K): x OP s[row]
    writes x's padding OP 0 there (x itself for add / sub, 0 for mul), by rows and in one pass.
    Broadcasting s into it made a norm's x - mean hold -mean in the padding, whose square after
    the per-row scale overflowed fp16 and turned the reduce's 0 * inf into NaN."""
    from rockjit.lowering.emitters.eltwise_row import build_binary_row

    t = 50
    lay = feature_layout(P, DType.F16, t, 1, 64)
    rng = np.random.default_rng(real)
    x = (rng.standard_normal((t, 1, 64)) * 8).astype(np.float16)
    s = (rng.standard_normal(t) * 300).astype(np.float16)
    x32, s32 = x.astype(np.float32), s.astype(np.float32)[:, None, None]
    progs = {"by rows": lambda op: R.build_row_rows(op, lay, P, R.row_cuts(t, P), real=real),
             "one pass": lambda op: build_binary_row(op, lay, False, P, real=real)}
    for form, build in progs.items():
        for op in ("sub", "mul", "add"):
            run = run_program(build(op), {"x": lay.pack(x), "s": pack_row_vector(s, P)})
            got = lay.unpack(run["out"])
            want = F32[op](x32, s32).astype(np.float16)
            want[..., real:] = F32[op](x32[..., real:], 0.0).astype(np.float16)
            _same(got, want, f"{form}: x {op} s[row], {real} real channels of 64")
