"""Feature-axis reductions: sum/mean as a ones-vector matmul on the simulator, and softmax's
start (row max -> x - max -> exp) chained from our emitters."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.eltwise_row import build_binary_row, pack_row_vector
from rockjit.lowering.emitters.lut import activation_error, build_activation
from rockjit.lowering.emitters.matmul import build_matmul
from rockjit.lowering.layouts import feature_layout, pack_matrix, unpack_matrix

from test_eltwise_harness import P, needs_sim, run_program

F16 = DType.F16

RECORDS = [("sum", 1, 1), ("sum", 1, 45), ("sum", 3, 5), ("mean", 4, 32), ("sum", 5, 48),
           ("mean", 13, 100), ("sum", 37, 45), ("mean", 64, 1024), ("sum", 250, 136),
           ("mean", 1500, 384), ("sum", 1500, 1536), ("mean", 7, 4096), ("sum", 1030, 40)]


@needs_sim
@pytest.mark.parametrize("kind,m,k", RECORDS)
def test_feature_reduce(kind, m, k) -> None:
    rng = np.random.default_rng(m * 7919 + k)
    x = rng.uniform(-4, 4, (m, k)).astype(np.float16)
    # the compiler's reduce_sum / mean form (rules/reduce.py): a matmul with a ones row
    w = 1.0 if kind == "sum" else 1.0 / k
    prog = build_matmul(m, k, 1, F16, DType.F32, P, b=np.full((1, k), w, np.float16))
    a, c = prog.buffer("a"), prog.buffer("c")
    xp = np.zeros((a.layout.height, a.layout.channels), np.float16)
    xp[:m, :k] = x
    # pad lanes hold finite junk: they meet zero weights and must not leak
    xp[m:, :] = 3.0
    xp[:, k:] = -2.0
    got = unpack_matrix(c.layout, run_program(prog, {"a": pack_matrix(a.layout, xp)})["c"])
    x64 = x.astype(np.float64)
    if kind == "sum":
        ref, w = x64.sum(1), 1.0
    else:
        ref, w = x64.mean(1), float(np.float16(1.0 / k))
    # fp32 accumulation of exact fp16 products, plus (mean) the fp16 weight 1/k
    bound = k * 2.0 ** -24 * np.abs(x64).sum(1) * max(w, 1.0) + T.FLOOR
    if kind == "mean":
        bound = bound + abs(w * k - 1.0) * np.abs(ref)
    T.check(got[:m, 0], ref, bound, f"{kind} {m}x{k}")
    assert np.all(got[:m, 1:] == 0)


@needs_sim
@pytest.mark.parametrize("rows,cols", [(4, 8), (37, 45), (300, 1500)])
def test_softmax_numerator_chain(rows, cols) -> None:
    """exp(x - rowmax(x)): the row max (the compiler's host ``reduce``; numpy here) in the
    per-row operand form, NPU per-row sub, NPU exp LUT on [-16, 0] -- our programs, buffers
    handed on unchanged."""
    rng = np.random.default_rng(rows + cols)
    lay = feature_layout(P, F16, rows, 1, cols)
    x = rng.uniform(-10, 10, (rows, 1, cols)).astype(np.float16)
    mx = pack_row_vector(x.max(2).ravel(), P)
    sub = build_binary_row("sub", lay, profile=P)
    raw = np.zeros(sub.buffer("x").nbytes, np.uint8)
    raw[:lay.nbytes] = lay.pack(x)
    shifted = run_program(sub, {"x": raw, "s": mx})["out"]
    ex = build_activation("exp", lay, (-16.0, 0.0), P)
    got = lay.unpack(run_program(ex, {"x": shifted[:ex.buffer("x").nbytes]})["out"])
    d = x.astype(np.float64) - x.astype(np.float64).max(2, keepdims=True)
    d16 = d.astype(np.float16).astype(np.float64)     # the sub rounds once to fp16
    ref = np.exp(np.clip(d16, -16, 0))
    T.check(got, ref, T.lut_bound(ref, activation_error("exp", d16, (-16.0, 0.0))), "softmax numerator")
