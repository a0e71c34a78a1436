"""HOST_RULES end to end: each IR op lowered to host steps and run through the C host-op
library, compared with the numpy reference (rockjit.ir.reference) over shapes and dtypes,
including scalars, zero-size tensors, broadcasting and the reference's edge semantics."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from rockjit.errors import VerifyError
from rockjit.ir.activations import FUSABLE
from rockjit.ir.ops import Group, Op
from rockjit.ir.types import DType, TensorType
from rockjit.lowering.host_expand import EXPANDED_RULES, lower_activation_on_host
from rockjit.lowering.host_rules import HOST_RULES, UNARY_CODES, lower_on_host
from rockjit.lowering.host_run import run_on_host
from rockjit.lowering.op_lowering import HostStep
from rockjit.lowering.regcmd import LoweringError
from rockjit.runtime.errors import ProgramError

from host_ops_testutil import (ALL, FLOATS, INTS, assert_close, assert_exact, gen, make_node,
                               reference)

SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 5), (2, 0, 3), (0,)]
TRANSCENDENTAL = {Op.EXP, Op.LOG, Op.TANH, Op.LOGISTIC, Op.ERF, Op.SIN, Op.COS}


def _defined(op, dtype, nin, attrs=None) -> bool:
    """Whether the IR defines ``op`` on ``dtype`` (so the table holds only real ops)."""
    try:
        make_node(op, [TensorType(dtype, (2,))] * nin, attrs or {})
        return True
    except VerifyError:
        return False


def run(node, inputs, stats=None):
    (out,) = run_on_host(lower_on_host(node), inputs, stats)
    return out


def t(dtype, shape):
    return TensorType(dtype, tuple(shape))


# ---------------------------------------------------------------- element-wise

UNARY_TABLE = [(op, dt) for op in UNARY_CODES
               for dt in FLOATS + (DType.I32, DType.I8, DType.I64, DType.U8)
               if _defined(op, dt, 1, {"y": 2} if op is Op.INTEGER_POW else None)]


@pytest.mark.parametrize("op,dtype", UNARY_TABLE, ids=[f"{o.text}-{d.value}" for o, d in UNARY_TABLE])
def test_unary(op, dtype):
    rng = np.random.default_rng(hash((op.text, dtype.value)) % 2**32)
    ys = [0, 1, 2, 3, 5, -1, -2] if op is Op.INTEGER_POW else [None]
    ran = 0
    for shape, y in itertools.product(SHAPES, ys):
        attrs = {"y": y} if y is not None else {}
        try:
            node = make_node(op, [t(dtype, shape)], attrs)
        except VerifyError:
            continue  # the IR has no such op (e.g. exp of an integer)
        x = gen(rng, dtype, shape, special=True)
        got, ref = run(node, [x]), reference(node, [x])
        what = f"{op.text}{'' if y is None else y} {dtype.value}{list(shape)}"
        if op in TRANSCENDENTAL:
            assert_close(got, ref, dtype, what)
        else:
            assert_exact(got, ref, what)
        ran += 1
    assert ran >= len(SHAPES)


BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.POW]
BINARY_TABLE = [(op, dt) for op in BINARY for dt in ALL if _defined(op, dt, 2)]


@pytest.mark.parametrize("op,dtype", BINARY_TABLE,
                         ids=[f"{o.text}-{d.value}" for o, d in BINARY_TABLE])
def test_binary(op, dtype):
    rng = np.random.default_rng(hash((op.text, dtype.value, 2)) % 2**32)
    ran = 0
    for shape in SHAPES:
        try:
            node = make_node(op, [t(dtype, shape)] * 2)
        except VerifyError:
            continue
        a = gen(rng, dtype, shape, special=True)
        b = gen(rng, dtype, shape, special=True)
        if op is Op.DIV and dtype in INTS and a.size >= 4:
            # the integer-division edges: x/0 and INT_MIN/-1
            b.reshape(-1)[:2] = 0
            if np.iinfo(a.dtype).min < 0:
                a.reshape(-1)[2], b.reshape(-1)[2] = np.iinfo(a.dtype).min, -1
                a.reshape(-1)[3], b.reshape(-1)[3] = -7, 2  # truncation toward zero
        if op is Op.POW and dtype.is_float:
            a = np.abs(a)  # keep most results finite; NaN cases come from the planted specials
        got, ref = run(node, [a, b]), reference(node, [a, b])
        what = f"{op.text} {dtype.value}{list(shape)}"
        if op is Op.POW:
            assert_close(got, ref, dtype, what)
        else:
            assert_exact(got, ref, what)
        ran += 1
    assert ran == len(SHAPES)


def test_max_min_propagate_nan():
    node_max = make_node(Op.MAX, [t(DType.F32, (4,))] * 2)
    node_min = make_node(Op.MIN, [t(DType.F32, (4,))] * 2)
    a = np.array([np.nan, 1.0, np.nan, -2.0], np.float32)
    b = np.array([3.0, np.nan, np.nan, 5.0], np.float32)
    for node, f in ((node_max, np.maximum), (node_min, np.minimum)):
        assert_exact(run(node, [a, b]), f(a, b), node.op.text)


@pytest.mark.parametrize("op", [Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE], ids=lambda o: o.text)
def test_compare(op):
    rng = np.random.default_rng(11)
    for dtype, shape in itertools.product(ALL, [(), (6,), (3, 4), (2, 0)]):
        node = make_node(op, [t(dtype, shape)] * 2)
        a = gen(rng, dtype, shape, special=True)
        b = a.copy()
        if b.size:  # some equal, some not
            b.reshape(-1)[::2] = gen(rng, dtype, b.reshape(-1)[::2].shape)
        assert_exact(run(node, [a, b]), reference(node, [a, b]), f"{op.text} {dtype.value}")


@pytest.mark.parametrize("ncases,which_dtype,scalar", [(1, DType.I32, False), (2, DType.BOOL, False),
                                                      (2, DType.BOOL, True), (3, DType.I32, False),
                                                      (5, DType.I32, False), (4, DType.I32, True)])
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I8, DType.I64], ids=lambda d: d.value)
def test_select_n(ncases, which_dtype, scalar, dtype):
    rng = np.random.default_rng(ncases)
    for shape in [(5,), (3, 4), (2, 0)]:
        wshape = () if scalar else shape
        node = make_node(Op.SELECT_N, [t(which_dtype, wshape)] + [t(dtype, shape)] * ncases)
        which = (rng.integers(0, ncases, wshape).astype(np.int32) if which_dtype is DType.I32
                 else rng.random(wshape) < 0.5)
        cases = [gen(rng, dtype, shape) for _ in range(ncases)]
        stats: dict[str, int] = {}
        got = run(node, [which, *cases], stats)
        assert_exact(got, reference(node, [which, *cases]), f"select_n {ncases} {dtype.value}")
        if got.size:
            assert stats["steps"] == -(-ncases // 2)  # two cases per host step


def test_select_n_out_of_range_selector():
    node = make_node(Op.SELECT_N, [t(DType.I32, (4,))] + [t(DType.F32, (4,))] * 3)
    which = np.array([0, 2, 3, 1], np.int32)
    with pytest.raises(ProgramError, match=r"selector value 3 at selector element 2 is outside "
                                           r"the 3 cases"):
        run(node, [which] + [np.zeros(4, np.float32)] * 3)


# ---------------------------------------------------------------- reductions

REDUCE_CASES = [((7,), (0,)), ((3, 5), (1,)), ((3, 5), (0,)), ((2, 3, 4), (0, 2)),
                ((2, 3, 4), (1,)), ((2, 3, 4), (0, 1, 2)), ((2, 3, 4), ()), ((3, 0), (1,)),
                ((0, 3), (1,)), ((), ()), ((4, 1, 300), (2,)), ((5, 1100), (1,))]


REDUCE_TABLE = [(op, dt) for op in (Op.REDUCE_SUM, Op.REDUCE_MAX) for dt in ALL
                if _defined(op, dt, 1, {"axes": (0,)})]


@pytest.mark.parametrize("op,dtype", REDUCE_TABLE,
                         ids=[f"{o.text}-{d.value}" for o, d in REDUCE_TABLE])
def test_reduce(op, dtype):
    rng = np.random.default_rng(hash((op.text, dtype.value)) % 2**32)
    for shape, axes in REDUCE_CASES:
        node = make_node(op, [t(dtype, shape)], {"axes": axes})
        x = gen(rng, dtype, shape, special=(op is Op.REDUCE_MAX))
        got, ref = run(node, [x]), reference(node, [x])
        what = f"{op.text}{list(axes)} {dtype.value}{list(shape)}"
        if op is Op.REDUCE_SUM and dtype.is_float:
            # f64 accumulation here vs numpy's pairwise f32 sum: bound by the f32 rounding of
            # a sum of |x| (n * 2^-24 each), then the result's own rounding
            mag = np.sum(np.abs(x.astype(np.float64)), axis=axes)
            n = max(1, int(np.prod([shape[a] for a in axes])))
            assert_close(got, ref, dtype, what, abs_=mag * n * 2.0 ** -24)
        else:
            assert_exact(got, ref, what)


# ---------------------------------------------------------------- shape ops

@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I8, DType.I64, DType.BOOL],
                         ids=lambda d: d.value)
def test_shape_ops(dtype):
    rng = np.random.default_rng(5)
    cases = [
        (Op.TRANSPOSE, [(2, 3, 4)], {"permutation": (2, 0, 1)}, None),
        (Op.TRANSPOSE, [(2, 3, 4, 5)], {"permutation": (3, 1, 0, 2)}, None),
        (Op.TRANSPOSE, [(3, 5)], {"permutation": (1, 0)}, None),
        (Op.TRANSPOSE, [(0, 5)], {"permutation": (1, 0)}, None),
        (Op.RESHAPE, [(2, 3, 4)], {}, (6, 4)),
        (Op.RESHAPE, [()], {}, (1, 1)),
        (Op.RESHAPE, [(2, 0)], {}, (0, 7)),
        (Op.BROADCAST_IN_DIM, [(3,)], {"broadcast_dimensions": (1,)}, (2, 3)),
        (Op.BROADCAST_IN_DIM, [(3, 1)], {"broadcast_dimensions": (1, 2)}, (2, 3, 4)),
        (Op.BROADCAST_IN_DIM, [()], {"broadcast_dimensions": ()}, (2, 3)),
        (Op.BROADCAST_IN_DIM, [(1, 4)], {"broadcast_dimensions": (0, 2)}, (5, 2, 4)),
        (Op.SLICE, [(6, 7)], {"start": (1, 0), "limit": (5, 7), "strides": (1, 3)}, None),
        (Op.SLICE, [(4, 5, 6)], {"start": (0, 2, 1), "limit": (4, 5, 6), "strides": (2, 2, 2)}, None),
        (Op.SLICE, [(4,)], {"start": (2,), "limit": (2,), "strides": (1,)}, None),
        (Op.CONCATENATE, [(2, 3), (4, 3), (0, 3)], {"dimension": 0}, None),
        (Op.CONCATENATE, [(2, 3, 2), (2, 1, 2), (2, 4, 2)], {"dimension": 1}, None),
        (Op.CONCATENATE, [(3, 1), (3, 2)], {"dimension": 1}, None),
        (Op.PAD, [(3, 4), ()], {"low": (1, 2), "high": (2, 0), "interior": (0, 1)}, None),
        (Op.PAD, [(5, 6), ()], {"low": (-2, 1), "high": (1, -3), "interior": (1, 0)}, None),
        (Op.PAD, [(4,), ()], {"low": (-3,), "high": (-2,), "interior": (2,)}, None),
        # negative edges that cut into the interior padding (not a multiple of its period)
        (Op.PAD, [(6, 5), ()], {"low": (-3, -1), "high": (0, 1), "interior": (1, 2)}, None),
        (Op.PAD, [(5,), ()], {"low": (-4,), "high": (-5,), "interior": (2,)}, None),
        (Op.PAD, [(0, 2), ()], {"low": (1, 1), "high": (1, 0), "interior": (0, 0)}, None),
        (Op.PAD, [(3,), ()], {"low": (0,), "high": (0,), "interior": (0,)}, None),
    ]
    for op, shapes, attrs, out_shape in cases:
        out_type = t(dtype, out_shape) if out_shape is not None else None
        node = make_node(op, [t(dtype, s) for s in shapes], attrs, out_type)
        ins = [gen(rng, dtype, s, special=True) for s in shapes]
        assert_exact(run(node, ins), reference(node, ins), f"{op.text} {attrs} {dtype.value}")


def test_concat_and_pad_step_counts():
    node = make_node(Op.CONCATENATE, [t(DType.F32, (2, 3)), t(DType.F32, (0, 3)),
                                      t(DType.F32, (1, 3))], {"dimension": 0})
    prog = lower_on_host(node)
    assert len(prog.steps) == 2  # the empty piece has nothing to copy
    pad = make_node(Op.PAD, [t(DType.F32, (3, 3)), t(DType.F32, ())],
                    {"low": (1, 1), "high": (1, 1), "interior": (0, 0)})
    assert [s.kind for s in lower_on_host(pad).steps] == ["copy", "copy"]


# ---------------------------------------------------------------- convert

@pytest.mark.parametrize("src", ALL, ids=lambda d: d.value)
def test_convert(src):
    rng = np.random.default_rng(hash(src.value) % 2**32)
    for dst in ALL:
        for shape in [(), (9,), (4, 6), (0, 3)]:
            node = make_node(Op.CONVERT, [t(src, shape)], {}, t(dst, shape))
            x = gen(rng, src, shape, special=True)
            if src.is_float and x.size:
                # values beyond every integer range, and fractions (truncation)
                with np.errstate(over="ignore"):  # 1e20 is inf in f16: intended
                    big = np.array([3e9, -3e9, 1e20, -1e20, 2.5, -2.5, 65519.0, 65520.0, 1e-8],
                                   np.float32).astype(src.to_numpy())
                n = min(x.size, big.size)
                x.reshape(-1)[-n:] = big[:n]
            assert_exact(run(node, [x]), reference(node, [x]),
                         f"convert {src.value}->{dst.value} {list(shape)}")


# ---------------------------------------------------------------- take / iota

TAKE_CASES = [((5, 4), 0, (3,)), ((5, 4), 1, (2, 2)), ((6,), 0, ()), ((3, 4, 5), 1, (2, 3)),
              ((3, 4, 5), 2, (7,)), ((1000, 64), 0, (9,)), ((4, 3), 0, (0,)), ((2, 3), 1, (2, 1, 2))]


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I32, DType.BOOL],
                         ids=lambda d: d.value)
@pytest.mark.parametrize("idx_dtype", [DType.I32, DType.I64, DType.U8], ids=lambda d: d.value)
def test_take(dtype, idx_dtype):
    rng = np.random.default_rng(3)
    for shape, axis, ishape in TAKE_CASES:
        node = make_node(Op.TAKE, [t(dtype, shape), t(idx_dtype, ishape)], {"axis": axis})
        x = gen(rng, dtype, shape)
        n = shape[axis]
        lo = 0 if idx_dtype is DType.U8 else -n  # negative indices count from the end
        idx = rng.integers(lo, n, ishape).astype(idx_dtype.to_numpy())
        assert_exact(run(node, [x, idx]), reference(node, [x, idx]),
                     f"take axis {axis} {dtype.value}{list(shape)} idx {list(ishape)}")


def test_take_out_of_range_index_is_named():
    node = make_node(Op.TAKE, [t(DType.F32, (5, 4)), t(DType.I32, (3,))], {"axis": 0})
    x = np.zeros((5, 4), np.float32)
    with pytest.raises(ProgramError, match=r"index 5 \(indices element 1\) is out of range for an "
                                           r"axis of size 5 \(valid: -5..4\)"):
        run(node, [x, np.array([0, 5, 1], np.int32)])
    with pytest.raises(ProgramError, match=r"index -6 \(indices element 2\)"):
        run(node, [x, np.array([0, 1, -6], np.int32)])


@pytest.mark.parametrize("dtype", [DType.I32, DType.F32, DType.F16, DType.U8, DType.I64],
                         ids=lambda d: d.value)
def test_iota(dtype):
    for shape, dim in [((7,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 300), 2), ((2, 0), 1),
                       ((2, 3, 4), 1)]:
        node = make_node(Op.IOTA, [], {"dimension": dim}, t(dtype, shape))
        assert_exact(run(node, []), reference(node, []), f"iota {dim} {dtype.value}{list(shape)}")


# ---------------------------------------------------------------- the program contract

def test_program_contract():
    """Inputs/outputs bound to the node's operands, one 448-byte const descriptor per step,
    whole-buffer slices named dst/src/src1/src2/desc."""
    node = make_node(Op.ADD, [t(DType.F16, (3, 4))] * 2)
    prog = lower_on_host(node)
    by_name = {b.name: b for b in prog.buffers}
    assert by_name["in0"].role == "input" and by_name["in0"].bind == 0
    assert by_name["in1"].role == "input" and by_name["in1"].bind == 1
    assert by_name["out"].role == "output" and by_name["out"].bind == 0
    assert by_name["out"].nbytes == 24 and by_name["out"].dtype == "f16"
    assert by_name["desc0"].role == "const" and by_name["desc0"].data.nbytes == 448
    (step,) = prog.steps
    assert isinstance(step, HostStep) and step.kind == "binary"
    assert set(step.operands) == {"dst", "src", "src1", "desc"}
    assert step.operands["src1"].buffer == "in1" and step.operands["src1"].nbytes == 24


def test_every_hostable_op_has_a_rule():
    # composites (softmax) are expanded into primitive ops before lowering (ir/composites.py)
    hostable = {op for op in Op if op not in (Op.CONSTANT, Op.PARAM, Op.DOT_GENERAL, Op.CONV)
                and op.group is not Group.COMPOSITE}
    assert hostable == set(HOST_RULES) | set(EXPANDED_RULES)


def test_no_rule_is_a_clear_error():
    node = make_node(Op.DOT_GENERAL, [t(DType.F32, (2, 3)), t(DType.F32, (3, 4))],
                     {"lhs_contract": (1,), "rhs_contract": (0,), "lhs_batch": (), "rhs_batch": ()})
    with pytest.raises(LoweringError, match="dot_general has no host implementation"):
        lower_on_host(node)


def test_rank_above_the_library_limit():
    node = make_node(Op.NEG, [t(DType.F32, (1,) * 9)])
    with pytest.raises(LoweringError, match="rank 9 exceeds the host library's 8 dimensions"):
        lower_on_host(node)


# ---------------------------------------------------------------- fused activations

def _jax_activation(kind: str, x: np.ndarray) -> np.ndarray:
    """The kind's jax.nn definition (independent of the record's expansion into IR ops; the
    record's jax_fn is pinned to a float64 formula by tests/numerics/test_lut_domains.py)."""
    from rockjit.ir.activations import ACTIVATIONS
    return np.asarray(ACTIVATIONS[kind].jax_fn(x.astype(np.float32)), np.float64)


@pytest.mark.parametrize("kind", FUSABLE)
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
def test_activation_host_fallback(kind, dtype):
    """activation{kind} with no LUT form runs as its record's expansion on the host library
    (a chain of unary/binary steps over scratch buffers, scalar constants at stride 0)."""
    x = np.concatenate([np.linspace(-30, 30, 241), [-1e-3, 0.0, 1e-3]]).astype(
        dtype.to_numpy()).reshape(4, 61)
    node = make_node(Op.ACTIVATION, [t(dtype, x.shape)], {"kind": kind})
    (got,) = run_on_host(lower_activation_on_host(node), [x])
    assert got.dtype == x.dtype and got.shape == x.shape
    # f32: a few roundings of a chain of ~8 f32 steps; f16: the chain runs in f32 and rounds
    # to fp16 once (a chain of fp16 steps fails here: 1 + erf(x) cancels)
    rel, abs_ = (2e-6, 2e-7) if dtype is DType.F32 else (2.0 ** -11 + 4e-6, 2.0 ** -24)
    ref = _jax_activation(kind, x)
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= rel * np.abs(ref) + abs_ + 2e-6 * np.abs(x)), (
        kind, dtype, float(np.max(err - rel * np.abs(ref))))
