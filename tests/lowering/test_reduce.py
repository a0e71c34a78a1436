"""Feature-axis reductions: sum/mean as a ones-vector matmul on the simulator, row max as host
steps run through the runtime's C host-step library, and softmax's start (row max -> x - max ->
exp) chained from our emitters."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.eltwise import build_binary_row
from rockjit.lowering.emitters.lut import activation_error, build_activation
from rockjit.lowering.emitters.eltwise import EW_VIEW_CHANNELS
from rockjit.lowering.emitters.matmul import build_matmul
from rockjit.lowering.layouts import feature_layout, pack_matrix, unpack_matrix
from rockjit.lowering.op_lowering import BufferSpec, HostStep, OpLowering, Slice

from test_eltwise_harness import P, Memory, needs_sim, run_program

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


# ---------------------------------------------------------------------------------------------
# host steps through the C library
# ---------------------------------------------------------------------------------------------

def run_host_step(mem: Memory, step: HostStep) -> None:
    """Execute ``step`` with the runtime's C host-step library (rj_host_step_run) over the
    simulator's buffers, built through rockjit.runtime.host_steps' constructors."""
    from rockjit._rjc import ffi, lib
    from rockjit.runtime.host_steps import HOST_STEPS, Operand
    names = list(mem.bufs)
    bos = ffi.new("rj_bo[]", len(names))
    keep = []
    for i, n in enumerate(names):
        iova, buf = mem.bufs[n]
        ptr = ffi.from_buffer("uint8_t[]", buf)
        keep.append(ptr)
        bos[i].host, bos[i].iova, bos[i].size, bos[i].handle = ptr, iova, buf.size, i + 1
        bos[i].map_size = buf.size
    ptrs = ffi.new("rj_bo *[]", [bos + i for i in range(len(names))])
    params = dict(step.params)
    dtypes, strides = params.pop("dtypes", {}), params.pop("row_strides", {})
    ops = {k: Operand(names.index(s.buffer), s.offset, dtypes.get(k, "f32"), strides.get(k, 0))
           for k, s in step.operands.items()}
    s = HOST_STEPS[step.kind](**ops, **params)
    err = ffi.new("rj_err *")
    moved = ffi.new("uint64_t *")
    rc = lib.rj_host_step_run(s, ptrs, len(names), moved, err)
    assert rc == 0, ffi.string(err.msg).decode()


def row_max_program(layout, out_format: str = "row_vector", profile=P) -> OpLowering:
    """out[p] = max over channels of x[p, :] for every position p (row) of an fp16 cube, as
    the runtime's unpack_cube + row_max host steps (the compiler itself uses the generic
    ``reduce`` host op; these exercise the runtime's kinds).

    ``out_format``: "row_vector" writes fp16 maxima into the per-row operand form of
    eltwise.build_binary_row (``row_vector_layout``: the max of row p at byte 16 p), so
    softmax's ``x - rowmax`` runs on the NPU next; "f32" writes a plain float32 [P] vector.
    Buffers: ``x`` (input 0), ``rows`` (scratch, row-major fp16 [P, C]), ``out`` (output 0).
    Steps: HostStep("unpack_cube"), HostStep("row_max")."""
    positions = layout.height * layout.width
    c = layout.channels
    dense = positions * c * 2
    if out_format == "row_vector":
        out_lay = feature_layout(profile, DType.F16, positions, 1, EW_VIEW_CHANNELS)
        out_spec = BufferSpec("out", "output", out_lay.nbytes, layout=out_lay, bind=0)
        dtype, stride, nbytes = "f16", profile.atom_bytes, out_lay.nbytes
    else:
        out_spec = BufferSpec("out", "output", positions * 4, dtype="float32", shape=(positions,),
                              bind=0)
        dtype, stride, nbytes = "f32", 4, positions * 4
    unpack = HostStep("unpack_cube", {"src": Slice("x", 0, layout.nbytes),
                                      "dst": Slice("rows", 0, dense)},
                      {"height": layout.height, "width": layout.width, "channels": c,
                       "c2": layout.c2, "esize": layout.esize,
                       "line_stride": layout.line_stride, "surf_stride": layout.surf_stride,
                       "dtypes": {"src": "f16", "dst": "f16"}, "row_strides": {}})
    rmax = HostStep("row_max", {"src": Slice("rows", 0, dense), "dst": Slice("out", 0, nbytes)},
                    {"rows": positions, "cols": c, "dtypes": {"src": "f16", "dst": dtype},
                     "row_strides": {"src": c * 2, "dst": stride}})
    bufs = (BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("rows", "scratch", dense, dtype="float16", shape=(positions, c)),
            out_spec)
    return OpLowering(bufs, (unpack, rmax))


HOST = {"row_max": run_host_step, "unpack_cube": run_host_step}

ROWMAX_RECORDS = [((1, 1, 1), "f32"), ((1, 1, 45), "f32"), ((37, 1, 45), "row_vector"),
                  ((7, 5, 19), "f32"), ((1500, 1, 384), "row_vector")]


@pytest.mark.parametrize("shape,fmt", ROWMAX_RECORDS)
def test_row_max_host_steps(shape, fmt) -> None:
    rng = np.random.default_rng(shape[0] * 31 + shape[2])
    lay = feature_layout(P, F16, *shape)
    x = rng.uniform(-30, 30, shape).astype(np.float16)
    prog = row_max_program(lay, fmt)
    assert [s.kind for s in prog.steps] == ["unpack_cube", "row_max"]
    mem = run_program(prog, {"x": lay.pack(x)}, HOST)
    ref = x.astype(np.float64).reshape(-1, shape[2]).max(1)
    if fmt == "f32":
        got = mem["out"][:ref.size * 4].view(np.float32)
    else:
        got = mem["out"][:ref.size * 16].view(np.float16)[::8]
    assert np.array_equal(got.astype(np.float64), ref)


@needs_sim
@pytest.mark.parametrize("rows,cols", [(4, 8), (37, 45), (300, 1500)])
def test_softmax_numerator_chain(rows, cols) -> None:
    """exp(x - rowmax(x)): host row max written in the per-row operand form, NPU per-row sub,
    NPU exp LUT on [-16, 0] -- three of our programs, buffers handed on unchanged."""
    rng = np.random.default_rng(rows + cols)
    lay = feature_layout(P, F16, rows, 1, cols)
    x = rng.uniform(-10, 10, (rows, 1, cols)).astype(np.float16)
    mx = run_program(row_max_program(lay, "row_vector"), {"x": lay.pack(x)}, HOST)
    sub = build_binary_row("sub", lay, profile=P)
    raw = np.zeros(sub.buffer("x").nbytes, np.uint8)
    raw[:lay.nbytes] = lay.pack(x)
    shifted = run_program(sub, {"x": raw, "s": mx["out"]})["out"]
    ex = build_activation("exp", lay, (-16.0, 0.0), P)
    got = lay.unpack(run_program(ex, {"x": shifted[:ex.buffer("x").nbytes]})["out"])
    d = x.astype(np.float64) - x.astype(np.float64).max(2, keepdims=True)
    d16 = d.astype(np.float16).astype(np.float64)     # the sub rounds once to fp16
    ref = np.exp(np.clip(d16, -16, 0))
    T.check(got, ref, T.lut_bound(ref, activation_error("exp", d16, (-16.0, 0.0))), "softmax numerator")
