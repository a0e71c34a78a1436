"""The one tolerance rule for comparing NPU results with the numpy reference.

fp16 has an 11-bit significand, so each rounding to fp16 moves a value by at most
u = 2**-11 of its magnitude (round-to-nearest-even).  A result is accepted when, element by
element, ``|got - ref| <= bound`` with the bound derived from where fp16 roundings happen:

* matmul / conv (fp16 operands, fp32 accumulation, fp16 or fp32 output): both operands are
  rounded to fp16 (each product then carries up to ~2u of relative error), the fp32 sum adds
  negligible error for the K we run (K·2**-24 << u), and an fp16 output adds u·|ref|:
  ``bound = 2u · (|A|·|B|ᵀ) + u·|ref| (fp16 out)``.
* element-wise (inputs rounded once, one op, output rounded once):
  ``bound = rounds · u · (|x| + |y| + |ref|)`` with the operands' magnitudes.
* a LUT activation: the table's documented interpolation error (per function, stated by the
  emitter that builds the table) plus the fp16 roundings above.

int8 paths are exact: integer arithmetic with int32 accumulation.  A tiny absolute floor
(``FLOOR``) absorbs fp16's subnormal spacing near zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir.activations import activation
from ..ir.graph import Node
from ..ir.interpreter import walk
from ..ir.ops import Group, Op
from ..ir.reference import evaluate
from ..lowering.fp16_range import U16
from ..lowering.rules.eltwise import LUT_FUNCS, SMALL_HOST_ELEMENTS

FLOOR = 2.0 ** -24        # fp16's smallest subnormal step


def matmul_bound(a: np.ndarray, b_nk: np.ndarray, fp16_out: bool = True) -> np.ndarray:
    """Bound for C = A·Bᵀ with A [..., M, K] and B [..., N, K] (fp16 operands)."""
    mag = np.abs(a.astype(np.float64)) @ np.swapaxes(np.abs(b_nk.astype(np.float64)), -1, -2)
    ref = a.astype(np.float64) @ np.swapaxes(b_nk.astype(np.float64), -1, -2)
    return 2 * U16 * mag + (U16 * np.abs(ref) if fp16_out else 0.0) + FLOOR


def elementwise_bound(ref: np.ndarray, *operands: np.ndarray, rounds: int = 2) -> np.ndarray:
    mag = np.abs(np.asarray(ref, np.float64))
    for x in operands:
        mag = mag + np.abs(np.asarray(x, np.float64))
    return rounds * U16 * mag + FLOOR


def check(got: np.ndarray, ref: np.ndarray, bound: np.ndarray | float, what: str = "") -> None:
    """Raise AssertionError naming the worst element when any |got - ref| exceeds its bound."""
    got64, ref64 = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got64.shape != ref64.shape:
        raise AssertionError(f"{what}: shape {got64.shape} != reference {ref64.shape}")
    if np.isnan(got64).any() and not np.isnan(ref64).any():
        raise AssertionError(f"{what}: NaN in result")
    err = np.abs(got64 - ref64)
    excess = err - np.broadcast_to(bound, err.shape)
    if (excess > 0).any():
        i = np.unravel_index(int(np.argmax(excess)), err.shape)
        raise AssertionError(
            f"{what}: {int((excess > 0).sum())} of {err.size} elements out of tolerance; worst at "
            f"{i}: got {got64[i]!r}, want {ref64[i]!r}, |err| {err[i]:.3g} > bound "
            f"{np.broadcast_to(bound, err.shape)[i]:.3g}")


def _pool_recip_error(node) -> float:
    """|r - 1| for the PPU average's scale r = fp16(65536/kw) fp16(65536/kh) 2^-32 kh kw
    (emitters.pool.recip_words; notes: encodings/ppu-pooling.md)."""
    from ..lowering.emitters.pool import recip_words

    win = [int(w) for w in node.attrs["window_dimensions"]]
    kh, kw = (win[-2], win[-1]) if len(win) >= 2 else (1, win[-1] if win else 1)
    if kh * kw < 2:
        return 0.0
    rw, rh = recip_words(kh, kw)
    f = np.array([rw, rh], np.uint16).view(np.float16).astype(np.float64)
    return abs(float(f[0] * f[1]) * 2.0 ** -32 * kh * kw - 1.0)


def lut_bound(ref: np.ndarray, table_error: np.ndarray | float) -> np.ndarray:
    """A LUT activation: the table's stated absolute error (``table_error``, from the emitter
    that builds the table, including any intermediate fp16 rounding of a 2-pass form) plus
    the final rounding to fp16 (one u of |ref|) and the FLOOR."""
    return np.asarray(table_error, np.float64) + elementwise_bound(ref, rounds=1)


# ---------------------------------------------------------------------------------------------
# end-to-end: a graph's error budget, propagated along its op chain
# ---------------------------------------------------------------------------------------------
#
# A whole graph's error is carried op by op in float64 as two parts per element:
#
# * a *systematic* part S, added in worst case: the LUT tables' interpolation error (a fixed
#   function of the input, lut.activation_error) and everything derived from it;
# * a *rounding* part with variance V: every fp16 rounding (RNE, error uniform within half an
#   ulp <= u|v|, variance <= (u|v|)^2 / 3) is an independent error. Contractions and sums add
#   many of them, and independent errors add in quadrature: a K-long dot product of errors
#   grows like sqrt(K), not K, which is what makes a deep chain (attention) checkable at all.
#
# First-order rules (x, y operands; z the result; D(v) = (u|v|)^2/3 one fp16 rounding):
#
#   inputs, weights, constants      S = 0, V = D(v)           (held in fp16 on the NPU)
#   matmul / conv  C = A.B          S = 0,  V = (V_A + S_A^2).B^2 + A^2.(V_B + S_B^2) + D(C)
#                                   (a systematic operand error meets weights of both signs,
#                                   so across K it adds in quadrature too -- an assumption
#                                   about the weights, true of trained and random ones; a
#                                   same-signed sum, reduce_sum, keeps it systematic)
#   add / sub                       S = S_x + S_y              V = V_x + V_y + D(z)
#   add / sub of a broadcast c      S = S_x + S_c + u|z|       V = V_x + V_c
#                                   (fl(x_i + c) rounds alike across a binade: _add)
#   max / min                       S, V of the larger input bound (1-Lipschitz)
#   reduce_max                      S, V the largest over the elements that can be the max
#                                   (value + own bound >= the row's largest value - bound):
#                                   a masked score far below its row never is
#   mul                             S = S_x|y| + |x|S_y        V = V_x y^2 + x^2 V_y + D(z)
#   div (host 1/y, DPU multiply)    S = S_x/|y| + |x|S_y/y^2   V = V_x/y^2 + x^2 V_y/y^4 + 2D(z)
#   x^k                             S, V through |k x^(k-1)|, + D(z)
#   reduce_sum over K (fp32 out)    S = sum S_x                V = sum V_x + K (2^-24 |x|)^2
#   a LUT function f (exp, tanh, sigmoid, rsqrt; an activation{kind}, ir/activations.py,
#   whose f' is jax.grad of the kind's definition)
#                                   S = |f'|S_x + table error  V = f'^2 V_x + D(f)
#                                   (table error: lut.activation_error over the domain the
#                                   compiler gives the table, calibrate.lut_domain; none for
#                                   an exp/rsqrt without one: host f32)
#   any other float function f      S = |f'|S_x                V = f'^2 V_x + D(f)
#   data movement                   S and V move with the data: shape ops, take (a gather
#                                   moves table rows), select_n (each element is one case's)
#   iota, integer/bool math         exact (S = V = 0)
#   compare                         exact when its operands are; a compare of values that
#                                   carry error can flip, which no additive bound describes:
#                                   refused (NotImplementedError)
#   constants beyond fp16's range   saturated to +-2^15 first, as the lowering does
#                                   (fp16_range.py: an additive mask's finfo.min or -inf)
#   LUT input below/above the table clamped (lut.py); the clamp adds |f(clamp x) - f(x)|
#
# The bound is  S + Z_SIGMA * sqrt(V) + FLOOR  with Z_SIGMA = 6: a rounding sum beyond six
# standard deviations has probability < 1e-8 per element (Chebyshev-free Gaussian tail; the
# sums here are over >= 32 independent terms). ``graph_bound`` returns it for every output.

Z_SIGMA = 6.0


def _lut_error(kind: str, x: np.ndarray, softmax: bool = False) -> np.ndarray:
    """The table error of ``kind`` on inputs ``x`` with the domain the compiler gives it
    (calibrate.lut_domain, from the function alone), plus what the clamp to that domain
    changes; zero where the op has no data-independent domain (it runs on the host in f32)."""
    from ..lowering.calibrate import clamp_error, lut_domain
    from ..lowering.emitters import lut

    dom = lut_domain(kind, softmax)
    if dom is None or np.asarray(x).size == 0:    # host f32, or an empty split piece
        return np.zeros_like(np.asarray(x, np.float64))
    if kind == "exp" and softmax:
        # softmax's exp is the squared half-exponent table (rules/eltwise.lower_lut_op, exp_sq)
        kind = "exp_sq"
    # activation_error is against f(clamp(x)); inputs outside the table also carry the clamp
    # (for x * gate(x) kinds the gate is clamped, not x)
    t = lut.activation_table(kind, dom)
    return lut.activation_error(kind, x, dom) + clamp_error(kind, x, t.lo, t.hi)


def _deriv(f, x: np.ndarray) -> np.ndarray:
    h = 1e-4 * np.maximum(1.0, np.abs(x))
    with np.errstate(all="ignore"):
        d = (f(x + h) - f(x - h)) / (2 * h)
    return np.nan_to_num(np.abs(d), nan=0.0, posinf=0.0)


def _round_var(v: np.ndarray) -> np.ndarray:
    # one rounding to fp16, uniform within half a step: u|v| for normal values, but below
    # 2^-14 the step is the fixed subnormal spacing 2^-24, so half a step is at least 2^-25
    # (a subnormal input such as 1.87e-6 -> 1.85e-6 is off by 1.1%, far past u|v|)
    return np.maximum(U16 * np.abs(v), 2.0 ** -25) ** 2 / 3.0


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


@dataclass
class Err:
    """What the oracle carries per value: the float64 value, its systematic part S and its
    rounding variance V (the rules above)."""

    val: np.ndarray
    s: np.ndarray
    v: np.ndarray


@dataclass
class At:
    """One node as an error rule sees it: operands' values ``ins``, systematic parts ``ss``,
    variances ``vs``; the result ``z`` and one fp16 rounding of it ``dz``."""

    node: Node
    ins: list[np.ndarray]
    ss: list[np.ndarray]
    vs: list[np.ndarray]
    z: np.ndarray
    dz: np.ndarray
    producers: dict
    folded: dict

    def ev(self, args) -> np.ndarray:
        """The node's own op on float64 stand-ins (data movement, contractions, sums)."""
        cast = [np.asarray(a, v.type.dtype.to_numpy()) for a, v in zip(args, self.node.inputs)]
        return _f64(evaluate(self.node.op, cast, self.node.attrs, self.node.out.type))


ErrorRule = Callable[[At], tuple[np.ndarray, np.ndarray]]
ERROR_RULES: dict[Op, ErrorRule] = {}


def _rule(*ops: Op) -> Callable[[ErrorRule], ErrorRule]:
    def register(f: ErrorRule) -> ErrorRule:
        for op in ops:
            assert op not in ERROR_RULES, f"two error rules for {op}"
            ERROR_RULES[op] = f
        return f
    return register


@_rule(Op.DOT_GENERAL, Op.CONV)
def _contract(a: At):
    x, w = a.ins
    # the operands' systematic (table) errors meet mixed-sign weights: each output sums K of
    # them with varying signs, so they add in quadrature like roundings
    return (np.zeros_like(a.z),
            a.ev([a.vs[0] + a.ss[0] ** 2, w * w]) + a.ev([x * x, a.vs[1] + a.ss[1] ** 2]) + a.dz)


def _expanded(a: At, k: int) -> bool:
    """Operand ``k`` is a broadcast: one value repeated along an axis of the result."""
    p = a.producers.get(a.node.inputs[k].id)
    return (p is not None and p.op is Op.BROADCAST_IN_DIM
            and int(np.prod(p.inputs[0].type.shape)) < int(np.prod(p.out.type.shape)))


@_rule(Op.ADD, Op.SUB)
def _add(a: At):
    s = np.broadcast_to(a.ss[0] + a.ss[1], a.z.shape)
    v = np.broadcast_to(a.vs[0] + a.vs[1], a.z.shape)
    if _expanded(a, 0) or _expanded(a, 1):
        # z_i = fl(x_i + c) with x_i on fp16's grid and c one fp16 value along the broadcast
        # axis: within a binade of z, x_i + c lies the same fraction of an ulp off the grid
        # (c mod ulp), so every z_i in that binade takes the *same* rounding error. Along the
        # axis the roundings are not independent: a sum over it (h - mean(h), then its mean
        # again) adds them coherently, K times one, not sqrt(K) (fuzz seed 1005: the second
        # row sum was 0.081 off where independent roundings allow 6 sigma = 0.039). Each is
        # still <= half a step: u|z|, or 2^-25 on the subnormal grid (as _round_var); carried
        # as systematic, worst case.
        return s + np.maximum(U16 * np.abs(a.z), 2.0 ** -25), v
    return s, v + a.dz


@_rule(Op.MAX, Op.MIN)
def _max(a: At):
    return (np.broadcast_to(np.maximum(a.ss[0], a.ss[1]), a.z.shape),
            np.broadcast_to(np.maximum(a.vs[0], a.vs[1]), a.z.shape))


@_rule(Op.MUL)
def _mul(a: At):
    (x, y), (sx, sy), (vx, vy) = a.ins, a.ss, a.vs
    return sx * np.abs(y) + np.abs(x) * sy + sx * sy, vx * y * y + x * x * vy + a.dz


@_rule(Op.DIV)
def _div(a: At):
    (x, y), (sx, sy), (vx, vy) = a.ins, a.ss, a.vs
    with np.errstate(all="ignore"):
        return (sx / np.abs(y) + np.abs(x) * sy / y ** 2,
                vx / y ** 2 + x * x * vy / y ** 4 + 2 * a.dz)


@_rule(Op.NEG, Op.CONVERT)
def _same(a: At):
    return a.ss[0], a.vs[0]


@_rule(*(op for op in Op if op.group is Group.SHAPE))
def _move(a: At):
    return a.ev(a.ss), a.ev(a.vs)


@_rule(Op.INTEGER_POW)
def _integer_pow(a: At):
    k = int(a.node.attrs["y"])
    d = np.abs(k * a.ins[0] ** (k - 1)) if k else np.zeros_like(a.z)
    return d * a.ss[0], d * d * a.vs[0] + a.dz


@_rule(Op.REDUCE_SUM)
def _reduce_sum(a: At):
    n = a.node
    kk = int(np.prod([n.inputs[0].type.shape[ax] for ax in n.attrs["axes"]]))
    return a.ev([a.ss[0]]), a.ev([a.vs[0]]) + kk * a.ev([(2.0 ** -24 * a.ins[0]) ** 2])


@_rule(Op.REDUCE_MAX)
def _reduce_max(a: At):
    axes = tuple(a.node.attrs["axes"])
    x, s, v = a.ins[0], a.ss[0], a.vs[0]
    b = s + Z_SIGMA * np.sqrt(v)
    with np.errstate(invalid="ignore"):
        cand = x + b >= np.max(x - b, axis=axes, keepdims=True)
    return (np.max(np.where(cand, s, 0.0), axis=axes).reshape(a.z.shape),
            np.max(np.where(cand, v, 0.0), axis=axes).reshape(a.z.shape))


@_rule(Op.REDUCE_WINDOW_MAX)
def _window_max(a: At):
    # the PPU's max picks one of its fp16 inputs: exact on them; the result carries the error
    # of the element it picked, at most the worst in its window
    return a.ev([a.ss[0]]), a.ev([a.vs[0]])


@_rule(Op.REDUCE_WINDOW_SUM)
def _window_sum(a: At):
    # rules.pool: a PPU average (window sum x fp16 reciprocals, rounded to fp16 once) times
    # the window size (one more fp16 rounding). The reciprocals' quantisation scales every
    # output by the same factor: a systematic relative error.
    return (a.ev([a.ss[0]]) + _pool_recip_error(a.node) * np.abs(a.z),
            a.ev([a.vs[0]]) + 2 * a.dz)


@_rule(Op.TAKE)
def _take(a: At):
    # a gather moves rows of the operand: their errors move with them (integer indices)
    return a.ev([a.ss[0], a.ins[1]]), a.ev([a.vs[0], a.ins[1]])


@_rule(Op.SELECT_N)
def _select(a: At):
    # each element is one case's element, chosen by an exact predicate
    return a.ev([a.ins[0]] + a.ss[1:]), a.ev([a.ins[0]] + a.vs[1:])


@_rule(*(op for op in Op if op.group is Group.COMPARE))
def _compare(a: At):
    if any(np.any(e != 0) for e in a.ss + a.vs):
        raise NotImplementedError(
            f"graph_bound: {a.node.op.text} at {a.node.loc} compares values that carry NPU "
            f"error; a flipped comparison is not bounded by an additive rule")
    return np.zeros_like(a.z), np.zeros_like(a.z)


@_rule(Op.IOTA)
def _exact(a: At):
    return np.zeros_like(a.z), np.zeros_like(a.z)


@_rule(Op.ACTIVATION)
def _activation(a: At):
    kind, x = a.node.attrs["kind"], a.ins[0]
    d = activation(kind).derivative(x)
    return d * a.ss[0] + _lut_error(kind, x), d ** 2 * a.vs[0] + a.dz


@_rule(*(op for op in Op if op.group is Group.UNARY and op not in ERROR_RULES))
def _unary(a: At):
    n = a.node
    if not n.out.type.dtype.is_float:
        return np.zeros_like(a.z), np.zeros_like(a.z)

    def fn(t):
        return _f64(evaluate(n.op, [np.asarray(t, n.inputs[0].type.dtype.to_numpy())],
                             n.attrs, n.out.type))
    d = _deriv(fn, a.ins[0])
    s = d * a.ss[0]
    kind = LUT_FUNCS.get(n.op)
    # rsqrt of a per-row vector (<= rules.eltwise.SMALL_HOST_ELEMENTS: LayerNorm's
    # 1/sqrt(var + eps)) is computed on the host in f32 (the compiler's own rule)
    if kind is not None and (kind != "rsqrt" or a.ins[0].size > SMALL_HOST_ELEMENTS):
        from ..lowering.calibrate import is_max_subtracted
        sm = kind == "exp" and is_max_subtracted(
            lambda v: a.producers.get(v.id), lambda v: a.folded.get(v.id), n.inputs[0])
        s = s + _lut_error(kind, a.ins[0], softmax=sm)
    return s, d * d * a.vs[0] + a.dz


def graph_bound(graph, params, inputs, trace: dict | None = None) -> list[np.ndarray]:
    """Per-element absolute error bound of every output of ``graph`` run on the NPU (rules
    above, ``ERROR_RULES`` keyed on the op), given the resident ``params`` and the run-time
    ``inputs``. ``trace`` (a dict) receives (op, max systematic, max rounding sigma) per value
    id, for diagnosis."""
    from ..ir.composites import expand
    from ..ir.passes.fuse import fuse
    from ..lowering.fold import fold_consts
    from ..lowering.fp16_range import saturate_consts

    # the bound describes the program, which the lowering builds from the fused graph with its
    # composites expanded (lowering/pipeline.lower_graph)
    graph = expand(fuse(graph))
    env: dict[int, Err] = {}
    for v, x in zip(graph.inputs, inputs):
        val = _f64(x)
        env[v.id] = Err(val, np.zeros_like(val),
                        _round_var(val) if v.type.dtype.is_float else np.zeros_like(val))
    folded = saturate_consts(fold_consts(graph, params), graph)
    producers = graph.producers()

    def compute(n: Node, args: list[Err]) -> Err:
        o = n.out.id
        if o in folded and n.op is not Op.IOTA:
            val = _f64(folded[o])
            # a constant fp16 holds exactly (a mask's saturated -2^15, 0, a power of two, a
            # small integer) carries no rounding; a non-finite one (softmax's -inf) is exact
            with np.errstate(over="ignore", invalid="ignore"):
                exact = ~np.isfinite(val) | (val.astype(np.float16).astype(np.float64) == val)
            var = np.where(exact, 0.0, _round_var(np.where(exact, 0, val))) \
                if n.out.type.dtype.is_float else np.zeros_like(val)
            return Err(val, np.zeros_like(val), var)
        at = At(n, [e.val for e in args], [e.s for e in args], [e.v for e in args],
                np.zeros(0), np.zeros(0), producers, folded)
        z = at.ev(at.ins)
        at.z, at.dz = z, _round_var(z)
        if not n.out.type.dtype.is_float and n.op.group is not Group.COMPARE:
            # integer and bool math (positions, index arithmetic, mask logic) is exact
            return Err(z, np.zeros_like(z), np.zeros_like(z))
        rule = ERROR_RULES.get(n.op)
        if rule is None:
            raise NotImplementedError(f"graph_bound has no error rule for {n.op.text}")
        s, var = rule(at)
        return Err(z, s, var)

    def observe(n: Node, e: Err) -> None:
        if trace is not None and e.s.size:
            trace[n.out.id] = (n.op.text, float(np.max(e.s)), float(np.sqrt(np.max(e.v))))

    outs = walk(graph, env, compute, observe)
    return [np.asarray(e.s + Z_SIGMA * np.sqrt(e.v)) + FLOOR for e in outs]
