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

import numpy as np

U16 = 2.0 ** -11          # unit roundoff of fp16
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
    from .emitters.pool import recip_words

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
#   max / min                       S, V of the larger input bound (1-Lipschitz)
#   reduce_max                      S, V the largest over the elements that can be the max
#                                   (value + own bound >= the row's largest value - bound):
#                                   a masked score far below its row never is
#   mul                             S = S_x|y| + |x|S_y        V = V_x y^2 + x^2 V_y + D(z)
#   div (host 1/y, DPU multiply)    S = S_x/|y| + |x|S_y/y^2   V = V_x/y^2 + x^2 V_y/y^4 + 2D(z)
#   x^k                             S, V through |k x^(k-1)|, + D(z)
#   reduce_sum over K (fp32 out)    S = sum S_x                V = sum V_x + K (2^-24 |x|)^2
#   a LUT function f (exp, tanh, sigmoid, rsqrt; a fused GELU / SiLU, ir/passes/fuse.py)
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
SMALL_HOST_ELEMENTS = 1 << 14   # rules.eltwise.prefer_host: per-row vectors stay on the host


def _lut_kind(op_text: str) -> str | None:
    return {"exp": "exp", "tanh": "tanh", "logistic": "sigmoid", "rsqrt": "rsqrt"}.get(op_text)


def _lut_error(kind: str, x: np.ndarray, softmax: bool = False) -> np.ndarray:
    """The table error of ``kind`` on inputs ``x`` with the domain the compiler gives it
    (calibrate.lut_domain, from the function alone), plus what the clamp to that domain
    changes; zero where the op has no data-independent domain (it runs on the host in f32)."""
    from .calibrate import clamp_error, lut_domain
    from .emitters import lut

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
    return (U16 * np.abs(v)) ** 2 / 3.0


def graph_bound(graph, params, inputs, trace: dict | None = None) -> list[np.ndarray]:
    """Per-element absolute error bound of every output of ``graph`` run on the NPU (rules
    above), given the resident ``params`` and the run-time ``inputs``. ``trace`` (a dict)
    receives (op, max systematic, max rounding sigma) per value id, for diagnosis."""
    from ..ir.ops import Group, Op
    from ..ir.passes.fuse import KNOWN, find_activations
    from ..ir.reference import evaluate
    from .calibrate import is_max_subtracted
    from .fp16_range import saturate_consts
    from .pipeline import fold_consts

    val: dict[int, np.ndarray] = {}
    sy: dict[int, np.ndarray] = {}
    va: dict[int, np.ndarray] = {}

    def f64(a):
        return np.asarray(a, np.float64)

    def ev(node, args):
        """The node's own op on float64 stand-ins (data movement, contractions, sums)."""
        cast = [np.asarray(a, v.type.dtype.to_numpy()) for a, v in zip(args, node.inputs)]
        return f64(evaluate(node.op, cast, node.attrs, node.out.type))

    for v, a in zip(graph.inputs, inputs):
        val[v.id] = f64(a)
        sy[v.id] = np.zeros_like(val[v.id])
        va[v.id] = _round_var(val[v.id]) if v.type.dtype.is_float else np.zeros_like(val[v.id])
    folded = saturate_consts(fold_consts(graph, params))
    producers = graph.producers()
    fused = find_activations(graph, folded)

    def visit(n) -> None:
        o = n.out.id
        if o in folded and n.op is not Op.IOTA:
            val[o] = f64(folded[o])
            sy[o] = np.zeros_like(val[o])
            # a constant fp16 holds exactly (a mask's saturated -2^15, 0, a power of two, a
            # small integer) carries no rounding; a non-finite one (softmax's -inf) is exact
            with np.errstate(over="ignore", invalid="ignore"):
                exact = ~np.isfinite(val[o]) | (val[o].astype(np.float16).astype(np.float64)
                                                 == val[o])
            va[o] = np.where(exact, 0.0, _round_var(np.where(exact, 0, val[o]))) \
                if n.out.type.dtype.is_float else np.zeros_like(val[o])
            return
        ins = [val[v.id] for v in n.inputs]
        ss = [sy[v.id] for v in n.inputs]
        vs = [va[v.id] for v in n.inputs]
        z = ev(n, ins)
        val[o] = z
        dz = _round_var(z)
        if not n.out.type.dtype.is_float and n.op.group is not Group.COMPARE:
            # integer and bool math (positions, index arithmetic, mask logic) is exact
            sy[o] = va[o] = np.zeros_like(z)
            return
        if o in fused:
            act = fused[o]
            x = val[act.x.id]
            d = _deriv(KNOWN[act.kind], x)
            sy[o] = d * sy[act.x.id] + _lut_error(act.kind, x)
            va[o] = d ** 2 * va[act.x.id] + dz
            return
        if n.op in (Op.DOT_GENERAL, Op.CONV):
            a, b = ins
            # the operands' systematic (table) errors meet mixed-sign weights: each output
            # sums K of them with varying signs, so they add in quadrature like roundings
            sy[o] = np.zeros_like(z)
            va[o] = ev(n, [vs[0] + ss[0] ** 2, b * b]) + ev(n, [a * a, vs[1] + ss[1] ** 2]) + dz
        elif n.op in (Op.ADD, Op.SUB):
            sy[o] = np.broadcast_to(ss[0] + ss[1], z.shape)
            va[o] = np.broadcast_to(vs[0] + vs[1], z.shape) + dz
        elif n.op in (Op.MAX, Op.MIN):
            sy[o] = np.broadcast_to(np.maximum(ss[0], ss[1]), z.shape)
            va[o] = np.broadcast_to(np.maximum(vs[0], vs[1]), z.shape)
        elif n.op is Op.MUL:
            x, y = ins
            sy[o] = ss[0] * np.abs(y) + np.abs(x) * ss[1] + ss[0] * ss[1]
            va[o] = vs[0] * y * y + x * x * vs[1] + dz
        elif n.op is Op.DIV:
            x, y = ins
            with np.errstate(all="ignore"):
                sy[o] = ss[0] / np.abs(y) + np.abs(x) * ss[1] / y ** 2
                va[o] = vs[0] / y ** 2 + x * x * vs[1] / y ** 4 + 2 * dz
        elif n.op is Op.NEG or n.op is Op.CONVERT:
            sy[o], va[o] = ss[0], vs[0]
        elif n.op.group is Group.SHAPE:
            sy[o], va[o] = ev(n, ss), ev(n, vs)
        elif n.op is Op.INTEGER_POW:
            k = int(n.attrs["y"])
            d = np.abs(k * ins[0] ** (k - 1)) if k else np.zeros_like(z)
            sy[o], va[o] = d * ss[0], d * d * vs[0] + dz
        elif n.op is Op.REDUCE_SUM:
            kk = int(np.prod([n.inputs[0].type.shape[a] for a in n.attrs["axes"]]))
            sy[o] = ev(n, [ss[0]])
            va[o] = ev(n, [vs[0]]) + kk * ev(n, [(2.0 ** -24 * ins[0]) ** 2])
        elif n.op is Op.REDUCE_MAX:
            axes = tuple(n.attrs["axes"])
            x = ins[0]
            b = ss[0] + Z_SIGMA * np.sqrt(vs[0])
            with np.errstate(invalid="ignore"):
                cand = x + b >= np.max(x - b, axis=axes, keepdims=True)
            sy[o] = np.max(np.where(cand, ss[0], 0.0), axis=axes).reshape(z.shape)
            va[o] = np.max(np.where(cand, vs[0], 0.0), axis=axes).reshape(z.shape)
        elif n.op is Op.REDUCE_WINDOW_MAX:
            # the PPU's max picks one of its fp16 inputs: exact on them; the result carries
            # the error of the element it picked, at most the worst in its window
            sy[o], va[o] = ev(n, [ss[0]]), ev(n, [vs[0]])
        elif n.op is Op.REDUCE_WINDOW_SUM:
            # rules.pool: a PPU average (window sum x fp16 reciprocals, rounded to fp16 once)
            # times the window size (one more fp16 rounding). The reciprocals' quantisation
            # scales every output by the same factor: a systematic relative error.
            sy[o] = ev(n, [ss[0]]) + _pool_recip_error(n) * np.abs(z)
            va[o] = ev(n, [vs[0]]) + 2 * dz
        elif n.op is Op.TAKE:
            # a gather moves rows of the operand: their errors move with them (the indices
            # are integers, exact)
            sy[o], va[o] = ev(n, [ss[0], ins[1]]), ev(n, [vs[0], ins[1]])
        elif n.op is Op.SELECT_N:
            # each element is one case's element, chosen by an exact predicate
            sy[o] = ev(n, [ins[0]] + ss[1:])
            va[o] = ev(n, [ins[0]] + vs[1:])
        elif n.op.group is Group.COMPARE:
            if any(np.any(e != 0) for e in ss + vs):
                raise NotImplementedError(
                    f"graph_bound: {n.op.text} at {n.loc} compares values that carry NPU "
                    f"error; a flipped comparison is not bounded by an additive rule")
            sy[o] = va[o] = np.zeros_like(z)
        elif n.op is Op.IOTA:
            sy[o] = va[o] = np.zeros_like(z)
        elif n.op.group is Group.UNARY and n.out.type.dtype.is_float:
            def fn(t, n=n):
                return f64(evaluate(n.op, [np.asarray(t, n.inputs[0].type.dtype.to_numpy())],
                                    n.attrs, n.out.type))
            d = _deriv(fn, ins[0])
            sy[o] = d * ss[0]
            va[o] = d * d * vs[0] + dz
            kind = _lut_kind(n.op.text)
            # rsqrt of a per-row vector (<= rules.eltwise.SMALL_HOST_ELEMENTS: LayerNorm's
            # 1/sqrt(var + eps)) is computed on the host in f32 (the compiler's own rule)
            if kind is not None and (kind != "rsqrt" or ins[0].size > SMALL_HOST_ELEMENTS):
                sm = kind == "exp" and is_max_subtracted(
                    lambda v: producers.get(v.id), lambda v: folded.get(v.id), n.inputs[0])
                sy[o] = sy[o] + _lut_error(kind, ins[0], softmax=sm)
        elif n.out.type.dtype.is_float:
            raise NotImplementedError(f"graph_bound has no error rule for {n.op.text}")
        else:
            sy[o] = va[o] = np.zeros_like(z)

    # values are freed after their last reader (an attention's [H, T, T] float64 triple is
    # hundreds of MB at T = 1500): peak memory is the live set, not the whole graph
    last: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v.id] = i
        if n.out.id in fused:
            last[fused[n.out.id].x.id] = i
    keep = {v.id for v in graph.outputs}
    for i, n in enumerate(graph.nodes):
        visit(n)
        o = n.out.id
        if trace is not None and o in sy and sy[o].size:
            trace[o] = (n.op.text, float(np.max(sy[o])), float(np.sqrt(np.max(va[o]))))
        dead = {v.id for v in n.inputs} | ({fused[o].x.id} if o in fused else set()) | {o}
        for d in dead:
            if last.get(d, -1) <= i and d not in keep:
                for m in (val, sy, va):
                    m.pop(d, None)
    return [np.asarray(sy[v.id] + Z_SIGMA * np.sqrt(va[v.id])) + FLOOR for v in graph.outputs]
