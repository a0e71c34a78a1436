"""Every supported jaxpr primitive: import, run on the IR interpreter, compare with JAX on CPU.

Each case names the primitive(s) it exists for, and the test first checks that JAX really
emitted them, so a case cannot silently stop covering its primitive after a jax upgrade."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from .helpers import assert_close, jaxpr_primitives, run_both

SHAPES = [(3,), (2, 5), (2, 3, 4)]


def f32(shape: tuple[int, ...], seed: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def i32(shape: tuple[int, ...], seed: int, lo: int = -5, hi: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.int32)


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    make: Callable[[tuple[int, ...]], tuple[Any, ...]]   # shape -> arguments
    prims: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...] = tuple(SHAPES)
    rtol: float = 1e-5
    atol: float = 1e-6


def unary(name: str, fn: Callable[..., Any], lo: float = -2.0, hi: float = 2.0, prims=None,
          **kw: Any) -> Case:
    return Case(name, fn, lambda s: (f32(s, 1, lo, hi),), prims or (name,), **kw)


def binary(name: str, fn: Callable[..., Any], lo: float = -2.0, hi: float = 2.0,
           **kw: Any) -> Case:
    return Case(name, fn, lambda s: (f32(s, 1, lo, hi), f32(s, 2, lo, hi)), (name,), **kw)


CASES = [
    # unary math
    unary("neg", lambda x: -x),
    unary("abs", jnp.abs),
    unary("exp", jnp.exp),
    unary("log", jnp.log, 0.1, 4.0),
    unary("tanh", jnp.tanh),
    unary("logistic", jax.nn.sigmoid),
    unary("erf", lax.erf),
    unary("sqrt", jnp.sqrt, 0.0, 4.0),
    unary("rsqrt", lax.rsqrt, 0.1, 4.0),
    unary("sin", jnp.sin, -6.0, 6.0),
    unary("cos", jnp.cos, -6.0, 6.0),
    unary("integer_pow", lambda x: x ** 3 + x ** -2, 0.5, 2.0),
    unary("square", jnp.square),
    unary("erfc", lax.erfc, -3.0, 3.0, atol=1e-6),
    unary("exp2", jnp.exp2, -4.0, 4.0, rtol=2e-6),
    unary("is_finite", lambda x: jnp.isfinite(jnp.log(x)), -1.0, 2.0),
    unary("sign", jnp.sign),
    unary("stop_gradient", lambda x: lax.stop_gradient(x) * 2.0),
    unary("copy", lambda x: jnp.copy(x) + 1.0, prims=("copy",)),
    # binary arithmetic, including the scalar-literal forms jaxprs use
    binary("add", lambda a, b: a + b),
    binary("sub", lambda a, b: a - b),
    binary("mul", lambda a, b: a * b),
    binary("div", lambda a, b: a / b, 0.5, 2.0),
    binary("max", jnp.maximum),
    binary("min", jnp.minimum),
    binary("pow", lambda a, b: a ** b, 0.5, 2.0, rtol=2e-6),
    unary("add", lambda x: x + 1.5, prims=("add",)),
    unary("mul", lambda x: 0.25 * x, prims=("mul",)),
    unary("max", jax.nn.relu, prims=("max", "custom_jvp_call")),
    unary("pow", lambda x: x ** 2.5, 0.5, 2.0, prims=("pow",), rtol=2e-6),
    Case("int_arith", lambda a, b: (a * 3 + b) - lax.div(a, 2), lambda s: (i32(s, 1), i32(s, 2)),
         ("mul", "add", "sub", "div")),
    Case("clamp", lambda x: lax.clamp(-0.5, x, 0.5), lambda s: (f32(s, 1),), ("clamp",)),
    # compare + select
    Case("compare", lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b),
         lambda s: (i32(s, 1, 0, 3).astype(np.float32), i32(s, 2, 0, 3).astype(np.float32)),
         ("eq", "ne", "lt", "le", "gt", "ge")),
    Case("select_n", lambda a, b: jnp.where(a > b, a, b * 2.0),
         lambda s: (f32(s, 1), f32(s, 2)), ("select_n", "gt")),
    Case("select_n_literal", lambda x: jnp.where(x > 0, x, 0.0), lambda s: (f32(s, 1),),
         ("select_n",)),
    Case("select_n_i32", lambda w, a, b, c: lax.select_n(w, a, b, c),
         lambda s: (i32(s, 0, 0, 3), f32(s, 1), f32(s, 2), f32(s, 3)), ("select_n",)),
    Case("logical", lambda x: jnp.logical_not(x > 0) & (x < 1.0) | (x == 0.5),
         lambda s: (f32(s, 1).round(1),), ("not", "and", "or")),
    # reductions
    Case("reduce_sum", lambda x: (jnp.sum(x, -1), jnp.sum(x), jnp.mean(x, 0)),
         lambda s: (f32(s, 1),), ("reduce_sum",)),
    Case("reduce_max", lambda x: (jnp.max(x, -1), jnp.max(x)), lambda s: (f32(s, 1),),
         ("reduce_max",)),
    Case("reduce_min", lambda x: jnp.min(x, 0), lambda s: (f32(s, 1),), ("reduce_min",)),
    # shape
    Case("broadcast_in_dim", lambda x: jnp.broadcast_to(x[..., None], x.shape + (3,)) + 1.0,
         lambda s: (f32(s, 1),), ("broadcast_in_dim",)),
    Case("reshape", lambda x: x.reshape(-1) * 2.0, lambda s: (f32(s, 1),), ("reshape",),
         shapes=((2, 5), (2, 3, 4))),
    Case("reshape_split_dim", lambda x: x.reshape(2, -1, 2), lambda s: (f32(s, 1),), ("reshape",),
         shapes=((4,), (12,), (2, 6))),
    Case("reshape_with_dimensions", lambda x: lax.reshape(x, (x.size,), dimensions=(1, 0)),
         lambda s: (f32(s, 1),), ("reshape",), shapes=((2, 5), (3, 4))),
    Case("transpose", lambda x: jnp.transpose(x)[..., ::1] + 0.0, lambda s: (f32(s, 1),),
         ("transpose",), shapes=((2, 5), (2, 3, 4))),
    Case("squeeze", lambda x: jnp.squeeze(x[None], 0) + x[..., 0:1].squeeze(-1)[..., None],
         lambda s: (f32(s, 1),), ("squeeze",)),
    Case("expand_dims", lambda x: jnp.expand_dims(x, 0) * jnp.expand_dims(x, -1)[..., 0],
         lambda s: (f32(s, 1),), ("broadcast_in_dim",)),
    Case("slice", lambda x: (x[1:], x[::2], x[-1]), lambda s: (f32(s, 1),), ("slice",)),
    Case("split", lambda x: jnp.split(x, [1], axis=0), lambda s: (f32(s, 1),), ("split",)),
    Case("concatenate", lambda a, b: jnp.concatenate([a, b, a], axis=-1),
         lambda s: (f32(s, 1), f32(s, 2)), ("concatenate",)),
    Case("pad", lambda x: jnp.pad(x, [(1, 2)] + [(0, 1)] * (x.ndim - 1), constant_values=-1.0),
         lambda s: (f32(s, 1),), ("pad",)),
    Case("pad_lax_negative_interior", lambda x: lax.pad(x, 0.5, [(-1, 2, 1)] * x.ndim),
         lambda s: (f32(s, 1),), ("pad",)),
    Case("iota", lambda x: x + jnp.arange(x.shape[-1], dtype=jnp.float32), lambda s: (f32(s, 1),),
         ("iota",)),
    Case("convert_element_type", lambda x: (x.astype(jnp.int32), (x > 0).astype(jnp.float32),
                                            x.astype(jnp.float16).astype(jnp.float32)),
         lambda s: (f32(s, 1, -5, 5),), ("convert_element_type",)),
    # contractions
    Case("dot_general_matmul", lambda a, b: a @ b, lambda s: (f32((4, 5), 1), f32((5, 3), 2)),
         ("dot_general",), shapes=((0,),)),
    Case("dot_general_batched", lambda a, b: jnp.einsum("bqd,bkd->bqk", a, b),
         lambda s: (f32((2, 4, 8), 1), f32((2, 6, 8), 2)), ("dot_general",), shapes=((0,),),
         rtol=1e-5, atol=1e-5),
    Case("dot_general_vec", lambda a, b: jnp.dot(a, b), lambda s: (f32(s, 1), f32(s, 2)),
         ("dot_general",), shapes=((3,), (17,)), atol=1e-5),
    Case("dot_general_bf16_pref", lambda a, b: jnp.dot(a.astype(jnp.bfloat16),
                                                       b.astype(jnp.bfloat16),
                                                       preferred_element_type=jnp.float32),
         lambda s: (f32((3, 4), 1), f32((4, 2), 2)), ("dot_general",), shapes=((0,),),
         rtol=1e-2, atol=1e-2),
    Case("conv_nhwc", lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
         lambda s: (f32((1, 5, 5, 3), 1), f32((3, 3, 3, 4), 2)), ("conv_general_dilated",),
         shapes=((0,),), atol=1e-5),
    Case("conv_nchw_strided_dilated", lambda x, w: lax.conv_general_dilated(
        x, w, (2, 1), ((1, 0), (2, 2)), rhs_dilation=(1, 2)),
         lambda s: (f32((2, 3, 7, 6), 1), f32((4, 3, 2, 3), 2)), ("conv_general_dilated",),
         shapes=((0,),), atol=1e-5),
    Case("conv_depthwise_1d", lambda x, w: lax.conv_general_dilated(
        x, w, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=4),
         lambda s: (f32((1, 9, 4), 1), f32((3, 1, 4), 2)), ("conv_general_dilated",),
         shapes=((0,),), atol=1e-5),
    # gather as take
    Case("gather_index", lambda t, ids: t[ids], lambda s: (f32((7, 3), 1), i32(s, 2, -7, 7)),
         ("gather",)),
    Case("gather_take_axis1", lambda t, ids: jnp.take(t, ids, axis=1),
         lambda s: (f32((2, 5, 3), 1), i32(s, 2, 0, 5)), ("gather",)),
    Case("gather_embedding", lambda t, ids: jnp.take(t, ids, axis=0),
         lambda s: (f32((11, 4), 1), i32((2, 6), 2, 0, 11)), ("gather",), shapes=((0,),)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_primitive_matches_jax(case: Case) -> None:
    for shape in case.shapes:
        args = case.make(shape)
        got, want, graph, closed = run_both(case.fn, *args)
        missing = set(case.prims) - jaxpr_primitives(closed)
        assert not missing, f"{case.name}: JAX no longer emits {missing} for this function"
        assert_close(got, want, case.rtol, case.atol)


def test_cases_cover_the_required_primitives() -> None:
    """The brief's list of primitives, each exercised by some case above."""
    required = {
        "dot_general", "add", "sub", "mul", "div", "neg", "max", "min", "exp", "log", "tanh",
        "logistic", "erf", "sqrt", "rsqrt", "integer_pow", "pow", "abs", "reduce_sum",
        "reduce_max", "broadcast_in_dim", "reshape", "transpose", "squeeze",
        "convert_element_type", "conv_general_dilated", "eq", "ne", "lt", "le", "gt", "ge",
        "select_n", "iota", "slice", "concatenate", "pad", "gather", "sin", "cos",
        "stop_gradient", "copy"}
    covered = {p for c in CASES for p in c.prims}
    assert required <= covered, sorted(required - covered)
