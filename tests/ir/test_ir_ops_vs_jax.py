"""One table of op records drives the interpreter-vs-jax.lax comparison for every IR op.

Each record: op, operand specs (shape, dtype, value range), attrs, result-type hint.  The
interpreter result must equal the jax.lax call on CPU in dtype and shape, and in value within a
tolerance chosen by dtype (exact for integers and bool; NaN where JAX has NaN).
"""
from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from rockjit.ir import Builder, DType, Op, TensorType
from rockjit.ir.activations import ACTIVATIONS, FUSABLE
from rockjit.ir.interpreter import run

F32, F16, BF16, I32, I8, U8, BOOL = (DType.F32, DType.F16, DType.BF16, DType.I32, DType.I8,
                                     DType.U8, DType.BOOL)


@dataclass(frozen=True)
class In:
    shape: tuple[int, ...]
    dtype: DType
    lo: float = -3.0
    hi: float = 3.0
    rounded: bool = False   # floats drawn from integers (so compares see ties)
    special: bool = False   # sprinkle NaN, +-inf and -0.0 into floats


@dataclass(frozen=True)
class Rec:
    op: Op
    ins: tuple[In, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    out: TensorType | None = None           # result-type hint for ops that need one
    tol: tuple[float, float] | None = None  # (rtol, atol) override

    def id(self) -> str:
        a = ",".join(f"{k}={v}" for k, v in self.attrs.items() if k != "value")
        ins = ",".join(f"{i.dtype.value}{list(i.shape)}" for i in self.ins)
        return f"{self.op.text}({ins}){{{a}}}" + (f"->{self.out}" if self.out else "")


def T(dt: DType, *shape: int) -> TensorType:
    return TensorType(dt, shape)


# ------------------------------------------------------------------------------- the table
TABLE: list[Rec] = []
SHAPES = [(), (1,), (2, 3, 4)]

_UNARY_RANGES = {Op.EXP: (-10, 10), Op.LOG: (0.05, 20), Op.TANH: (-5, 5), Op.LOGISTIC: (-20, 20),
                 Op.ERF: (-4, 4), Op.SQRT: (0.0, 50), Op.RSQRT: (0.05, 50), Op.SIN: (-7, 7),
                 Op.COS: (-7, 7), Op.NEG: (-5, 5), Op.ABS: (-5, 5)}
for op, (lo, hi) in _UNARY_RANGES.items():
    for dt, shape in [(F32, s) for s in SHAPES] + [(F16, (2, 3, 4)), (BF16, (2, 3, 4))]:
        TABLE.append(Rec(op, (In(shape, dt, lo, hi),)))
for op in (Op.NEG, Op.ABS):
    TABLE.append(Rec(op, (In((5,), I32, -2**31, 2**31 - 1),)))  # includes wrap at INT_MIN
    TABLE.append(Rec(op, (In((2, 3), I8, -128, 127),)))
TABLE.append(Rec(Op.EXP, (In((4, 4), F32, special=True),)))
for y in (0, 1, 2, 3, 5, -1, -2):
    TABLE.append(Rec(Op.INTEGER_POW, (In((2, 5), F32, -2, 2),), {"y": y}))
TABLE.append(Rec(Op.INTEGER_POW, (In((7,), F16, -2, 2),), {"y": 3}))
TABLE.append(Rec(Op.INTEGER_POW, (In((7,), I32, -1000, 1000),), {"y": 3}))  # wraps
# the fused composite activations (ir/passes/fuse.py): the numpy reference against the kind's
# jax.nn definition (pinned to independent formulas by tests/numerics/test_lut_domains.py)
JAX_ACTIVATIONS = {k: ACTIVATIONS[k].jax_fn for k in FUSABLE}
for axes in ([1], [0, 2], [2]):
    TABLE.append(Rec(Op.SOFTMAX, (In((2, 3, 4), F32, -30, 30),), {"axes": axes}))
TABLE.append(Rec(Op.SOFTMAX, (In((3, 5), F16, -8, 8),), {"axes": [1]}))
for axes, eps in (([1], 1e-5), ([0, 2], 1e-6), ([2], 0.0)):
    TABLE.append(Rec(Op.LAYER_NORM, (In((2, 3, 4), F32, -30, 30),), {"axes": axes, "eps": eps}))


def _jax_layer_norm(x, axes, eps):
    """torch.nn.LayerNorm's arithmetic without gain and shift, in jax.numpy."""
    c = x - jnp.mean(x, axis=axes, keepdims=True)
    return c * lax.rsqrt(jnp.mean(c * c, axis=axes, keepdims=True) + eps)

def _jax_matmul_epilogue(xs, a):
    """act(x . w * scale + bias + residual) in jax (ops.py's order)."""
    y = lax.dot_general(xs[0], xs[1], _dn(a))
    rest = list(xs[2:])
    scale = rest.pop(1 if a["bias"] else 0) if a["scale"] else None
    if scale is not None:
        y = y * scale
    if a["bias"]:
        y = y + rest.pop(0)
    if a["residual"]:
        y = y + rest.pop(0)
    return y if a["act"] == "none" else JAX_ACTIVATIONS[a["act"]](y)


_EP = {"lhs_contract": [1], "rhs_contract": [1], "lhs_batch": [], "rhs_batch": []}
for flags, act in (((1, 0, 0), "none"), ((1, 1, 1), "gelu"), ((0, 1, 0), "silu"),
                   ((0, 0, 1), "none")):
    bias, scale, residual = (bool(f) for f in flags)
    ins = [In((5, 16), F32, -2, 2), In((6, 16), F32, -1, 1)]
    ins += [In((6,), F32, -3, 3)] * (bias + scale) + [In((5, 6), F32, -3, 3)] * residual
    TABLE.append(Rec(Op.MATMUL_EPILOGUE, tuple(ins), {**_EP, "bias": bias, "scale": scale,
                                                      "residual": residual, "act": act}))
TABLE.append(Rec(Op.MATMUL_EPILOGUE, (In((2, 3, 8), F32), In((2, 4, 8), F32), In((4,), F32)),
                 {"lhs_contract": [2], "rhs_contract": [2], "lhs_batch": [0], "rhs_batch": [0],
                  "bias": True, "scale": False, "residual": False, "act": "none"}))

for kind in JAX_ACTIVATIONS:
    for dt, shape in [(F32, (2, 3, 4)), (F32, ()), (F16, (2, 3, 4))]:
        TABLE.append(Rec(Op.ACTIVATION, (In(shape, dt, -12, 12),), {"kind": kind}))

for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN):
    for dt, shape in [(F32, ()), (F32, (2, 3)), (F32, (1, 5, 1)), (F16, (2, 3)), (I32, (2, 3)),
                      (I32, ())]:
        lo, hi = (-7, 7) if dt is I32 else (-3, 3)
        TABLE.append(Rec(op, (In(shape, dt, lo, hi), In(shape, dt, lo, hi))))
    TABLE.append(Rec(op, (In((9,), BF16), In((9,), BF16))))
    TABLE.append(Rec(op, (In((3, 3), U8, 0, 255), In((3, 3), U8, 0, 255))))
for op in (Op.MAX, Op.MIN):
    TABLE.append(Rec(op, (In((4, 4), BOOL), In((4, 4), BOOL))))
    TABLE.append(Rec(op, (In((4, 4), F32, special=True), In((4, 4), F32, special=True))))
TABLE.append(Rec(Op.DIV, (In((6, 6), I32, -2**31, 2**31 - 1), In((6, 6), I32, -2, 2))))
TABLE.append(Rec(Op.DIV, (In((6,), I8, -128, 127), In((6,), I8, -1, 1))))
TABLE.append(Rec(Op.DIV, (In((4, 4), F32, special=True), In((4, 4), F32, -1, 1, rounded=True))))
for dt, shape in itertools.product((F32, F16), [(), (3, 4)]):
    TABLE.append(Rec(Op.POW, (In(shape, dt, 0.1, 4), In(shape, dt, -3, 3))))
TABLE.append(Rec(Op.POW, (In((8,), F32, -3, 3, rounded=True), In((8,), F32, -2, 2, rounded=True))))

for op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE):
    TABLE.append(Rec(op, (In((3, 4), F32, -2, 2, rounded=True),) * 2))
    TABLE.append(Rec(op, (In((), F16, -1, 1, rounded=True),) * 2))
    TABLE.append(Rec(op, (In((2, 5), I32, -2, 2),) * 2))
    TABLE.append(Rec(op, (In((6,), BOOL),) * 2))
    TABLE.append(Rec(op, (In((5,), F32, special=True),) * 2))

TABLE += [
    Rec(Op.SELECT_N, (In((2, 3), BOOL), In((2, 3), F32), In((2, 3), F32))),
    Rec(Op.SELECT_N, (In((), BOOL), In((4,), I32, -9, 9), In((4,), I32, -9, 9))),
    Rec(Op.SELECT_N, (In((3, 2), I32, 0, 2), In((3, 2), F16), In((3, 2), F16), In((3, 2), F16))),
    Rec(Op.SELECT_N, (In((5,), I32, 0, 0), In((5,), BOOL))),
]

for dt, shape, axes in [(F32, (3, 4), (1,)), (F32, (3, 4), (0, 1)), (F32, (3, 4), ()),
                        (F32, (2, 3, 4), (0, 2)), (F32, (), ()), (F32, (0, 3), (0,)),
                        (F16, (4, 16), (1,)), (BF16, (4, 8), (0,)), (I32, (5, 3), (0,)),
                        (I32, (1, 1), (0, 1))]:
    TABLE.append(Rec(Op.REDUCE_SUM, (In(shape, dt, -2, 2),), {"axes": axes}))
    TABLE.append(Rec(Op.REDUCE_MAX, (In(shape, dt, -2, 2),), {"axes": axes}))
TABLE.append(Rec(Op.REDUCE_MAX, (In((3, 4), BOOL),), {"axes": (1,)}))
TABLE.append(Rec(Op.REDUCE_MAX, (In((3, 4), F32, special=True),), {"axes": (1,)}))


def _window(op: Op, x: In, window: tuple[int, ...], strides: tuple[int, ...],
            padding: tuple[tuple[int, int], ...]) -> Rec:
    return Rec(op, (x,), {"window_dimensions": window, "window_strides": strides,
                          "padding": padding})


for _wop in (Op.REDUCE_WINDOW_MAX, Op.REDUCE_WINDOW_SUM):
    TABLE += [
        _window(_wop, In((1, 2, 8, 8), F32), (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0),) * 4),
        _window(_wop, In((2, 3, 7, 6), F32), (1, 1, 2, 2), (1, 1, 2, 2),
                ((0, 0), (0, 0), (1, 0), (0, 1))),
        _window(_wop, In((1, 4, 9, 9), F16, -2, 2), (1, 1, 3, 3), (1, 1, 1, 1),
                ((0, 0), (0, 0), (1, 1), (1, 1))),
        _window(_wop, In((2, 10), BF16, -2, 2), (2, 3), (1, 2), ((0, 1), (2, 0))),
        _window(_wop, In((5, 6), I32, -9, 9), (2, 2), (1, 3), ((1, 0), (0, 2))),
        _window(_wop, In((1, 1, 2), F32), (1, 1, 3), (1, 1, 1), ((0, 0),) * 3),  # empty
    ]
TABLE.append(_window(Op.REDUCE_WINDOW_MAX, In((1, 1, 6, 6), F32, special=True), (1, 1, 2, 2),
                     (1, 1, 2, 2), ((0, 0),) * 4))


def _lax_window(xs: list[np.ndarray], a: dict, kind: str) -> Any:
    x = xs[0]
    if kind == "sum":
        init, comp = np.zeros((), x.dtype), lax.add
    elif x.dtype.kind in "iu":
        init, comp = np.array(np.iinfo(x.dtype).min, x.dtype), lax.max
    else:
        init, comp = np.array(-np.inf, x.dtype), lax.max
    return lax.reduce_window(x, init, comp, a["window_dimensions"], a["window_strides"],
                             [tuple(p) for p in a["padding"]])

TABLE += [
    Rec(Op.BROADCAST_IN_DIM, (In((3,), F32),), {"broadcast_dimensions": (1,)}, T(F32, 2, 3)),
    Rec(Op.BROADCAST_IN_DIM, (In((1, 3), F16),), {"broadcast_dimensions": (0, 1)}, T(F16, 4, 3)),
    Rec(Op.BROADCAST_IN_DIM, (In((), I32, -5, 5),), {"broadcast_dimensions": ()}, T(I32, 2, 2)),
    Rec(Op.BROADCAST_IN_DIM, (In((3, 1), BOOL),), {"broadcast_dimensions": (1, 2)},
        T(BOOL, 2, 3, 5)),
    Rec(Op.BROADCAST_IN_DIM, (In((2,), F32),), {"broadcast_dimensions": (0,)}, T(F32, 2)),
    Rec(Op.RESHAPE, (In((2, 3, 4), F32),), {}, T(F32, 6, 4)),
    Rec(Op.RESHAPE, (In((), I32),), {}, T(I32, 1, 1)),
    Rec(Op.RESHAPE, (In((4,), BOOL),), {}, T(BOOL, 2, 1, 2)),
    Rec(Op.RESHAPE, (In((0, 3), F16),), {}, T(F16, 3, 0)),
    Rec(Op.TRANSPOSE, (In((2, 3, 4), F32),), {"permutation": (2, 0, 1)}),
    Rec(Op.TRANSPOSE, (In((1, 5), I32),), {"permutation": (1, 0)}),
    Rec(Op.TRANSPOSE, (In((), F16),), {"permutation": ()}),
    Rec(Op.SLICE, (In((10,), F32),), {"start": (2,), "limit": (9,), "strides": (3,)}),
    Rec(Op.SLICE, (In((4, 5), I32),), {"start": (1, 0), "limit": (3, 5), "strides": (1, 2)}),
    Rec(Op.SLICE, (In((3,), F16),), {"start": (1,), "limit": (1,), "strides": (1,)}),
    Rec(Op.SLICE, (In((), F32),), {"start": (), "limit": (), "strides": ()}),
    Rec(Op.CONCATENATE, (In((2, 3), F32), In((4, 3), F32)), {"dimension": 0}),
    Rec(Op.CONCATENATE, (In((2, 1), I32), In((2, 0), I32), In((2, 2), I32)), {"dimension": 1}),
    Rec(Op.CONCATENATE, (In((3,), BOOL),), {"dimension": 0}),
    Rec(Op.PAD, (In((3, 4), F32), In((), F32)), {"low": (1, -1), "high": (2, 0),
                                                "interior": (1, 0)}),
    Rec(Op.PAD, (In((5,), I32, -9, 9), In((), I32, -9, 9)), {"low": (-2,), "high": (-1,),
                                                              "interior": (2,)}),
    Rec(Op.PAD, (In((), F16), In((), F16)), {"low": (), "high": (), "interior": ()}),
    Rec(Op.PAD, (In((1, 2), F32), In((), F32)), {"low": (0, 3), "high": (2, 0),
                                                "interior": (4, 4)}),
]

for src, dst, lo, hi in [(F32, I32, -3e9, 3e9), (F32, U8, -300, 300), (F32, I8, -200, 200),
                         (F32, F16, -7e4, 7e4), (F32, BF16, -1e5, 1e5), (F16, F32, -100, 100),
                         (BF16, F16, -100, 100), (F16, BF16, -100, 100), (I32, F32, -2**31, 2**31 - 1),
                         (I32, I8, -1000, 1000), (U8, I32, 0, 255), (I32, BOOL, -1, 1),
                         (BOOL, F32, 0, 1), (BOOL, I32, 0, 1), (F32, BOOL, -1, 1)]:
    TABLE.append(Rec(Op.CONVERT, (In((3, 5), src, lo, hi, rounded=src.is_float and dst is BOOL),),
                     {}, T(dst, 3, 5)))
TABLE.append(Rec(Op.CONVERT, (In((4, 4), F32, special=True),), {}, T(I32, 4, 4)))
TABLE.append(Rec(Op.CONVERT, (In((4, 4), F32, special=True),), {}, T(F16, 4, 4)))
TABLE.append(Rec(Op.CONVERT, (In((), F32),), {}, T(F32)))

_MM = {"lhs_contract": (1,), "rhs_contract": (0,), "lhs_batch": (), "rhs_batch": ()}
TABLE += [
    Rec(Op.DOT_GENERAL, (In((3, 4), F32), In((4, 5), F32)), _MM),
    Rec(Op.DOT_GENERAL, (In((1, 64), F32), In((64, 1), F32)), _MM),
    Rec(Op.DOT_GENERAL, (In((3, 32), F16, -1, 1), In((32, 5), F16, -1, 1)), _MM),
    Rec(Op.DOT_GENERAL, (In((3, 32), F16, -1, 1), In((32, 5), F16, -1, 1)), _MM, T(F32, 3, 5)),
    Rec(Op.DOT_GENERAL, (In((3, 16), BF16, -1, 1), In((16, 2), BF16, -1, 1)), _MM),
    Rec(Op.DOT_GENERAL, (In((3, 4), I32, -50, 50), In((4, 5), I32, -50, 50)), _MM),
    Rec(Op.DOT_GENERAL, (In((2, 3, 4), F32), In((2, 4, 5), F32)),
        {"lhs_contract": (2,), "rhs_contract": (1,), "lhs_batch": (0,), "rhs_batch": (0,)}),
    # attention scores q.k^T with heads as a batch dim: [B,S,H,D] x [B,T,H,D] -> [B,H,S,T]
    Rec(Op.DOT_GENERAL, (In((2, 3, 2, 4), F32), In((2, 5, 2, 4), F32)),
        {"lhs_contract": (3,), "rhs_contract": (3,), "lhs_batch": (0, 2), "rhs_batch": (0, 2)}),
    Rec(Op.DOT_GENERAL, (In((4,), F32), In((4,), F32)),
        {"lhs_contract": (0,), "rhs_contract": (0,), "lhs_batch": (), "rhs_batch": ()}),
    Rec(Op.DOT_GENERAL, (In((3,), F32), In((2,), F32)),
        {"lhs_contract": (), "rhs_contract": (), "lhs_batch": (), "rhs_batch": ()}),
    Rec(Op.DOT_GENERAL, (In((3, 0), F32), In((0, 2), F32)), _MM),
]


def _conv(lhs: In, rhs: In, strides: tuple[int, ...], padding: tuple[tuple[int, int], ...],
          lhs_dil: tuple[int, ...] | None = None, rhs_dil: tuple[int, ...] | None = None,
          groups: int = 1, out: TensorType | None = None) -> Rec:
    ns = len(strides)
    return Rec(Op.CONV, (lhs, rhs), {"window_strides": strides, "padding": padding,
                                     "lhs_dilation": lhs_dil or (1,) * ns,
                                     "rhs_dilation": rhs_dil or (1,) * ns,
                                     "feature_group_count": groups}, out)


TABLE += [
    _conv(In((1, 3, 10), F32), In((4, 3, 3), F32), (1,), ((1, 1),)),
    _conv(In((2, 3, 8, 8), F32), In((4, 3, 3, 3), F32), (2, 2), ((1, 1), (0, 1))),
    _conv(In((1, 3, 6, 6), F32), In((3, 1, 3, 3), F32), (1, 1), ((1, 1), (1, 1)), groups=3),
    _conv(In((1, 4, 5, 5), F32), In((6, 2, 2, 2), F32), (1, 1), ((0, 0), (0, 0)), groups=2),
    _conv(In((1, 2, 5, 4), F32), In((3, 2, 3, 2), F32), (1, 2), ((2, 1), (0, 0)),
          lhs_dil=(2, 1), rhs_dil=(1, 2)),
    _conv(In((1, 3, 16, 16), F32), In((8, 3, 4, 4), F32), (4, 4), ((0, 0), (0, 0))),
    _conv(In((1, 2, 9), F32), In((2, 2, 3), F32), (2,), ((-1, 2),)),
    _conv(In((1, 4, 7), F16, -1, 1), In((5, 4, 3), F16, -1, 1), (1,), ((1, 1),)),
    _conv(In((1, 4, 7), F16, -1, 1), In((5, 4, 3), F16, -1, 1), (1,), ((1, 1),),
          out=T(F32, 1, 5, 7)),
    _conv(In((1, 1, 2), F32), In((1, 1, 3), F32), (1,), ((0, 0),)),  # window larger: empty
]

TABLE += [
    Rec(Op.TAKE, (In((10, 4), F32), In((3,), I32, 0, 9)), {"axis": 0}),
    Rec(Op.TAKE, (In((10, 4), F16), In((2, 3), I32, 0, 9)), {"axis": 0}),
    Rec(Op.TAKE, (In((3, 5), I32, -9, 9), In((), I32, 0, 4)), {"axis": 1}),
    Rec(Op.TAKE, (In((2, 3, 4), F32), In((5,), I32, 0, 2)), {"axis": 1}),
    Rec(Op.IOTA, (), {"dimension": 1}, T(I32, 4, 5)),
    Rec(Op.IOTA, (), {"dimension": 0}, T(F32, 3)),
    Rec(Op.IOTA, (), {"dimension": 0}, T(F16, 2, 3)),
    Rec(Op.CONSTANT, (), {"value": np.array([[1.5, -2.0], [np.inf, np.nan]], np.float32)}),
    Rec(Op.CONSTANT, (), {"value": np.array(True)}),
    Rec(Op.PARAM, (In((3, 2), F32),), {"name": "layer.weight"}, T(F32, 3, 2)),
]


# ------------------------------------------------------------------- jax.lax equivalents
def _dn(a: dict[str, Any]) -> Any:
    return ((a["lhs_contract"], a["rhs_contract"]), (a["lhs_batch"], a["rhs_batch"]))


LaxFn = Callable[[list[np.ndarray], dict[str, Any], TensorType], Any]
LAX: dict[Op, LaxFn] = {
    Op.CONSTANT: lambda xs, a, t: jnp.asarray(a["value"]),
    Op.PARAM: lambda xs, a, t: jnp.asarray(xs[0]),
    Op.IOTA: lambda xs, a, t: lax.broadcasted_iota(t.dtype.to_numpy(), t.shape, a["dimension"]),
    Op.NEG: lambda xs, a, t: lax.neg(*xs),
    Op.ABS: lambda xs, a, t: lax.abs(*xs),
    Op.EXP: lambda xs, a, t: lax.exp(*xs),
    Op.LOG: lambda xs, a, t: lax.log(*xs),
    Op.TANH: lambda xs, a, t: lax.tanh(*xs),
    Op.LOGISTIC: lambda xs, a, t: lax.logistic(*xs),
    Op.ERF: lambda xs, a, t: lax.erf(*xs),
    Op.SQRT: lambda xs, a, t: lax.sqrt(*xs),
    Op.RSQRT: lambda xs, a, t: lax.rsqrt(*xs),
    Op.SIN: lambda xs, a, t: lax.sin(*xs),
    Op.COS: lambda xs, a, t: lax.cos(*xs),
    Op.INTEGER_POW: lambda xs, a, t: lax.integer_pow(xs[0], a["y"]),
    Op.ACTIVATION: lambda xs, a, t: JAX_ACTIVATIONS[a["kind"]](*xs),
    Op.SOFTMAX: lambda xs, a, t: jax.nn.softmax(xs[0], axis=tuple(a["axes"])),
    Op.LAYER_NORM: lambda xs, a, t: _jax_layer_norm(xs[0], tuple(a["axes"]), a["eps"]),
    Op.MATMUL_EPILOGUE: lambda xs, a, t: _jax_matmul_epilogue(xs, a),
    Op.ADD: lambda xs, a, t: lax.add(*xs),
    Op.SUB: lambda xs, a, t: lax.sub(*xs),
    Op.MUL: lambda xs, a, t: lax.mul(*xs),
    Op.DIV: lambda xs, a, t: lax.div(*xs),
    Op.MAX: lambda xs, a, t: lax.max(*xs),
    Op.MIN: lambda xs, a, t: lax.min(*xs),
    Op.POW: lambda xs, a, t: lax.pow(*xs),
    Op.EQ: lambda xs, a, t: lax.eq(*xs),
    Op.NE: lambda xs, a, t: lax.ne(*xs),
    Op.LT: lambda xs, a, t: lax.lt(*xs),
    Op.LE: lambda xs, a, t: lax.le(*xs),
    Op.GT: lambda xs, a, t: lax.gt(*xs),
    Op.GE: lambda xs, a, t: lax.ge(*xs),
    Op.SELECT_N: lambda xs, a, t: lax.select_n(*xs),
    Op.REDUCE_SUM: lambda xs, a, t: lax.reduce_sum(xs[0], a["axes"]),
    Op.REDUCE_MAX: lambda xs, a, t: lax.reduce_max(xs[0], a["axes"]),
    Op.REDUCE_WINDOW_MAX: lambda xs, a, t: _lax_window(xs, a, "max"),
    Op.REDUCE_WINDOW_SUM: lambda xs, a, t: _lax_window(xs, a, "sum"),
    Op.BROADCAST_IN_DIM: lambda xs, a, t: lax.broadcast_in_dim(xs[0], t.shape,
                                                               a["broadcast_dimensions"]),
    Op.RESHAPE: lambda xs, a, t: lax.reshape(xs[0], t.shape),
    Op.TRANSPOSE: lambda xs, a, t: lax.transpose(xs[0], a["permutation"]),
    Op.SLICE: lambda xs, a, t: lax.slice(xs[0], a["start"], a["limit"], a["strides"]),
    Op.CONCATENATE: lambda xs, a, t: lax.concatenate(xs, a["dimension"]),
    Op.PAD: lambda xs, a, t: lax.pad(xs[0], xs[1], list(zip(a["low"], a["high"],
                                                            a["interior"]))),
    Op.CONVERT: lambda xs, a, t: lax.convert_element_type(xs[0], t.dtype.to_numpy()),
    Op.DOT_GENERAL: lambda xs, a, t: lax.dot_general(xs[0], xs[1], _dn(a),
                                                     preferred_element_type=t.dtype.to_numpy()),
    Op.CONV: lambda xs, a, t: lax.conv_general_dilated(
        xs[0], xs[1], a["window_strides"], a["padding"], a["lhs_dilation"], a["rhs_dilation"],
        feature_group_count=a["feature_group_count"], preferred_element_type=t.dtype.to_numpy()),
    Op.TAKE: lambda xs, a, t: jnp.take(xs[0], xs[1], axis=a["axis"]),
}


def test_table_covers_every_op() -> None:
    assert set(LAX) == set(Op)
    assert {r.op for r in TABLE} == set(Op), sorted(o.text for o in set(Op) - {r.op for r in TABLE})


# ------------------------------------------------------------------------ the test itself
def _draw(spec: In, rng: np.random.Generator) -> np.ndarray:
    dt = spec.dtype.to_numpy()
    if spec.dtype is BOOL:
        return rng.integers(0, 2, spec.shape).astype(bool)
    if spec.dtype.is_int:
        return rng.integers(int(spec.lo), int(spec.hi), spec.shape, endpoint=True,
                            dtype=np.int64).astype(dt)
    x = rng.uniform(spec.lo, spec.hi, spec.shape)
    if spec.rounded:
        x = np.round(x)
    if spec.special and x.size:
        flat = x.reshape(-1)
        specials = [np.nan, np.inf, -np.inf, -0.0]
        for i, s in zip(rng.choice(flat.size, min(flat.size, 4), replace=False), specials):
            flat[i] = s
    return np.asarray(x, dtype=np.float32).astype(dt)


def _graph_inputs(rec: Rec, arrays: list[np.ndarray]) -> tuple[Any, list[np.ndarray], dict]:
    b = Builder("op")
    vals = [b.input(TensorType.of(a)) for a in arrays]
    out = b.add(rec.op, vals, rec.out, rec.attrs)
    return b.finish([out]), arrays, {}


def _graph_param(rec: Rec, arrays: list[np.ndarray]) -> tuple[Any, list[np.ndarray], dict]:
    b = Builder("op")
    out = b.add(rec.op, [], rec.out, rec.attrs)
    return b.finish([out]), [], {rec.attrs["name"]: arrays[0]}


# How a record becomes a graph: operands are graph inputs, except a param's is bound by name.
GRAPH_OF: dict[Op, Callable[[Rec, list[np.ndarray]], tuple[Any, list[np.ndarray], dict]]] = {
    Op.PARAM: _graph_param,
}

# Reductions and contractions sum many rounded terms; XLA's f16/bf16 reduce_sum accumulates in
# the narrow type while the reference uses f32, so allow a few ulps per term there.
_TOL = {DType.F32: (2e-6, 2e-6), DType.F16: (1e-3, 1e-3), DType.BF16: (8e-3, 8e-3)}
_SUM_TOL = {DType.F32: (1e-5, 1e-5), DType.F16: (4e-3, 2e-2), DType.BF16: (3e-2, 6e-2)}
_SUM_OPS = {Op.REDUCE_SUM, Op.REDUCE_WINDOW_SUM, Op.DOT_GENERAL, Op.CONV, Op.MATMUL_EPILOGUE}


@pytest.mark.parametrize("rec", TABLE, ids=[r.id() for r in TABLE])
def test_interpreter_matches_lax(rec: Rec) -> None:
    rng = np.random.default_rng(zlib.crc32(rec.id().encode()))
    arrays = [_draw(s, rng) for s in rec.ins]
    graph, inputs, params = GRAPH_OF.get(rec.op, _graph_inputs)(rec, arrays)
    (ours,) = run(graph, inputs, params)
    with jax.default_device(jax.devices("cpu")[0]):
        theirs = np.asarray(LAX[rec.op](arrays, rec.attrs, graph.outputs[0].type))
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    dt = graph.outputs[0].type.dtype
    if not dt.is_float:
        np.testing.assert_array_equal(ours, theirs)
        return
    rtol, atol = rec.tol or (_SUM_TOL if rec.op in _SUM_OPS else _TOL)[dt]
    np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=rtol,
                               atol=atol, equal_nan=True)
    # Where the values are equal, signs of infinities and NaN positions must be too.
    np.testing.assert_array_equal(np.isnan(ours.astype(np.float64)),
                                  np.isnan(theirs.astype(np.float64)))
