"""Fused host steps (RJ_HOST_FUSED, lowering/host_fuse.py): a list of element-wise host ops run
in order as one runtime step. References: numpy float32 in the same operation order, bit for
bit, on the prepared path (program load) and the unprepared one (a descriptor BO some step
writes); chains whose fp32 order matters, NaN/inf/-0 edges, an int convert, a converting
strided store into a padded NPU-style row vector; and the refusals of malformed records."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering.host_fuse import descriptor, record
from rockjit.lowering.host_rules import BINARY_CODES, UNARY_CODES, HostView, encode_descriptor
from rockjit.ir.ops import Op
from rockjit.runtime import NullDevice, Operand, ProgramBuilder, host_steps
from rockjit.runtime.errors import AddressError, ProgramError

F32, F16, I32 = DType.F32, DType.F16, DType.I32
N = 37          # not a multiple of any vector width
# slot 0 (dst): the work area, f32 vectors at element offsets k * N; slot 1 (src): inputs
W = 16 * N


def _v(k: int, dt: DType = F32, stride: int = 1) -> HostView:
    return HostView("x", dt, k * N, (stride,))


def _op(kind: str, out: HostView, ins: list[HostView], op: Op | None = None,
        slots: tuple[int, ...] | None = None) -> np.ndarray:
    code = {"unary": UNARY_CODES, "binary": BINARY_CODES}.get(kind, {}).get(op, 0)
    d = encode_descriptor(kind, (N,), [out, *ins], code)
    return record(d, slots or (0,) + (1,) * len(ins))


def _run(records: list[np.ndarray], inputs: np.ndarray, unprepared: bool = False) -> np.ndarray:
    """Run one fused step over slot 0 (work, zeroed) and slot 1 (``inputs``, f32): the work
    area after the run."""
    blob = descriptor(records)
    with NullDevice() as dev:
        b = ProgramBuilder(dev)
        work, src = b.add_bo(W * 4, "io"), b.add_bo(inputs.nbytes, "io")
        desc = b.add_bo(blob.size + 64, "weights")
        b.upload(desc, blob)
        if unprepared:
            # a step writing the descriptor's BO (past the descriptor) keeps the fused step
            # off the prepared path: it resolves and checks its records when it runs
            cd = encode_descriptor("copy", (1,), [HostView("o", DType.U8, blob.size, (1,)),
                                                  HostView("i", DType.U8, 0, (1,))])
            cbo = b.add_bo(512, "weights")
            b.upload(cbo, cd)
            b.add_host_step(host_steps.HOST_STEPS["copy"](dst=Operand(desc), src=Operand(src),
                                                          desc=Operand(cbo)))
        b.add_host_step(host_steps.HOST_STEPS["fused"](dst=Operand(work), src=Operand(src),
                                                       desc=Operand(desc)))
        p = b.build()
        p.write(src, inputs)
        p.run()
        out = p.read_array(work, np.uint8, (W * 4,))
        p.close()
    return out


def _f32(work: np.ndarray, k: int) -> np.ndarray:
    return work.view(np.float32)[k * N:(k + 1) * N]


def _inputs(seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    a = (r.standard_normal(N) * 1e8).astype(np.float32)
    b = r.uniform(-3, 3, N).astype(np.float32)
    c = r.uniform(0.1, 5, N).astype(np.float32)
    return np.concatenate([a, b, c]).astype(np.float32)


@pytest.mark.parametrize("unprepared", [False, True])
def test_a_chain_whose_fp32_order_matters_matches_numpy_bit_for_bit(unprepared):
    """t1 = a + b; t2 = t1 - a (0 or a rounding of b: not b); t3 = t2 * c; t4 = t3 / b;
    t5 = max(t4, t2); t6 = rsqrt(|t5| + c); then t6 as f16 into every 4th lane from lane 1
    of a padded row vector (the NPU's form). Any reordering or fused multiply-add changes
    bits of t2..t6."""
    x = _inputs(0)
    a, b, c = x[:N], x[N:2 * N], x[2 * N:]
    A, B, C = (HostView("s", F32, k * N, (1,)) for k in range(3))
    recs = [_op("binary", _v(0), [A, B], Op.ADD),
            _op("binary", _v(1), [_v(0), A], Op.SUB, (0, 0, 1)),
            _op("binary", _v(2), [_v(1), C], Op.MUL, (0, 0, 1)),
            _op("binary", _v(3), [_v(2), B], Op.DIV, (0, 0, 1)),
            _op("binary", _v(4), [_v(3), _v(1)], Op.MAX, (0, 0, 0)),
            _op("unary", _v(5), [_v(4)], Op.ABS, (0, 0)),
            _op("binary", _v(6), [_v(5), C], Op.ADD, (0, 0, 1)),
            _op("unary", _v(7), [_v(6)], Op.RSQRT, (0, 0)),
            # the converting store: f32 -> f16 into lanes 1, 5, 9, ... of elements 16N..
            _op("copy", HostView("x", F16, 2 * 8 * N + 1, (4,)), [_v(7)], None, (0, 0))]
    work = _run(recs, x, unprepared)
    t1 = a + b
    t2 = t1 - a
    t3 = t2 * c
    t4 = t3 / b
    t5 = np.maximum(t4, t2)
    t7 = np.float32(1) / np.sqrt(np.abs(t5) + c)
    assert not np.array_equal(t2, b)              # the order is observable in these inputs
    for k, want in enumerate((t1, t2, t3, t4, t5, np.abs(t5), np.abs(t5) + c, t7)):
        np.testing.assert_array_equal(_f32(work, k).view(np.uint32), want.view(np.uint32),
                                      err_msg=f"t{k + 1}")
    lanes = work.view(np.float16)[2 * 8 * N + 1:][::4][:N]
    np.testing.assert_array_equal(lanes.view(np.uint16), t7.astype(np.float16).view(np.uint16))
    gaps = work.view(np.float16)[2 * 8 * N:2 * 8 * N + 4 * N].reshape(N, 4)[:, [0, 2, 3]]
    assert not gaps.any()                         # the other lanes are left as they were


@pytest.mark.parametrize("unprepared", [False, True])
def test_nan_inf_and_signed_zero_edges_follow_numpy(unprepared):
    """max(x, 0) (NaN propagates) -> rsqrt (0 -> inf, -0 -> -inf) -> * 0 (inf * 0 = NaN)
    -> min(., 65504) -> f16; then a truncating f32 -> i32 convert and back."""
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 4.0, 1e-40, 2.5, -2.5,
                  1e30, 65505.0] + [3.0] * (N - 13), np.float32)
    zero = np.zeros(N, np.float32)
    inputs = np.concatenate([x, zero, np.full(N, 65504, np.float32)])
    X, Z, M = (HostView("s", F32, k * N, (1,)) for k in range(3))
    recs = [_op("binary", _v(0), [X, Z], Op.MAX),
            _op("unary", _v(1), [_v(0)], Op.RSQRT, (0, 0)),
            _op("binary", _v(2), [_v(1), Z], Op.MUL, (0, 0, 1)),
            _op("binary", _v(3), [_v(1), M], Op.MIN, (0, 0, 1)),
            _op("copy", HostView("x", F16, 2 * 4 * N, (1,)), [_v(3)], None, (0, 0)),
            _op("copy", _v(5, I32), [HostView("s", F32, 0, (1,))], None, (0, 1)),
            _op("copy", _v(6), [_v(5, I32)], None, (0, 0))]
    with np.errstate(all="ignore"):
        t0 = np.maximum(x, zero)
        t1 = np.float32(1) / np.sqrt(t0)
        t2 = t1 * zero
        t3 = np.minimum(t1, np.float32(65504))
        finite = np.isfinite(x) & (np.abs(x) < 2 ** 31)
        t5 = np.where(finite, x, 0).astype(np.int32)
    work = _run(recs, inputs, unprepared)
    for k, want in ((0, t0), (1, t1), (2, t2), (3, t3)):
        got = _f32(work, k)
        np.testing.assert_array_equal(got, want, err_msg=f"t{k}")
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]),
                                      np.signbit(want[~np.isnan(want)]), err_msg=f"t{k} sign")
    h = work.view(np.float16)[2 * 4 * N:2 * 4 * N + N]
    np.testing.assert_array_equal(h, t3.astype(np.float16))
    i32 = work.view(np.int32)[5 * N:6 * N]
    np.testing.assert_array_equal(i32[finite], t5[finite])
    np.testing.assert_array_equal(_f32(work, 6)[finite], t5[finite].astype(np.float32))


def test_a_non_elementwise_op_is_refused_naming_it():
    d = encode_descriptor("reduce", (N,), [HostView("x", F32, 0, (0,)), HostView("s", F32, 0, (1,))],
                          1, 1)
    with pytest.raises(ProgramError, match="op 1 of 2 .*reduce.* not an element-wise op"):
        _run([_op("unary", _v(0), [_v(1)], Op.NEG, (0, 0)), record(d, (0, 1))],
             np.zeros(3 * N, np.float32))


def test_an_op_writing_another_slot_is_refused():
    with pytest.raises(ProgramError, match="writes a slot other than 0"):
        _run([_op("unary", _v(0), [_v(1)], Op.NEG, (1, 0))], np.zeros(3 * N, np.float32))


def test_an_unset_slot_is_refused():
    with pytest.raises(ProgramError, match="names a slot that is not set"):
        _run([_op("unary", _v(0), [_v(1)], Op.NEG, (0, 2))], np.zeros(3 * N, np.float32))


def test_a_view_past_its_slot_is_refused_before_any_op_runs():
    with pytest.raises(AddressError, match="op 1 of 2.*reaches element"):
        _run([_op("unary", _v(0), [_v(1)], Op.NEG, (0, 0)),
              _op("unary", _v(1), [HostView("s", F32, 3 * N - 1, (1,))], Op.NEG, (0, 1))],
             np.zeros(3 * N, np.float32))
