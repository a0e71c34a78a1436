"""Value ranges for LUT domains.

With concrete example arguments (the first call's), the IR interpreter's op references run the
graph once and record each float value's (min, max). With abstract arguments
(jax.ShapeDtypeStruct) no data exists, so conservative static bounds are used instead:

* ``exp`` whose input is ``x - broadcast(reduce_max(x))`` (softmax): the input is <= 0; below
  the LUT's default floor (-16) exp is under 2^-23, beneath fp16's resolution next to the row
  maximum's exp(0) = 1, so clamping there changes no softmax output by more than that. This
  table is [-16, 0] with example arguments too: an attention mask (or a later call's wider
  scores) puts inputs far below anything the example showed, and they are clamped to the
  table's start, which must therefore be where exp is already ~0.
* saturating functions (tanh, sigmoid, GELU gates): the emitter's default domain, outside which
  the function equals its limit to fp16 precision.
* anything else: the emitter's default domain.

The LUT emitter is given the calibrated range widened by ``MARGIN`` of its width on each side
(later inputs may exceed the example's). Inputs outside the domain are **clamped** to it by
the emitter (lut.py: the result is f(clamp(x))), which is exact for saturating functions and
bounded by the function's change over the excess otherwise.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.ops import Op
from ..ir.reference import evaluate
from .rules.base import Calibration, RuleContext

MARGIN = 0.25          # of the calibrated width, on each side
# The softmax exp table never reaches below this (module docstring): exp(-16) < 2^-23, and
# every input under ln(2^-16) ~ -11.1 already quantises to the table's floor entry q = 1
# (lut_tables: QUIRK 4), so a lower start only coarsens the table. A masked score
# (fp16_range.MASK_MAGNITUDE below its row) is far under it: clamped to the floor entry.
EXP_FLOOR = -16.0
_MIN_WIDTH = 1e-3      # a constant input still gets a non-degenerate table


def calibrate(graph: Graph, inputs: Sequence[Any] | None,
              params: Mapping[str, np.ndarray]) -> Calibration:
    """Ranges of every float value on the example ``inputs`` (None or abstract: empty,
    ``source='static'``)."""
    if inputs is None or any(not isinstance(x, np.ndarray) and not np.isscalar(x)
                             and not hasattr(x, "__array__") for x in inputs):
        return Calibration({}, "static")
    try:
        arrays = [np.asarray(x) for x in inputs]
    except Exception:
        return Calibration({}, "static")
    env: dict[int, np.ndarray] = {}
    ranges: dict[int, tuple[float, float]] = {}
    last: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v.id] = i
    keep = {v.id for v in graph.outputs}

    def record(v: Value, a: np.ndarray) -> None:
        if v.type.dtype.is_float and a.size:
            f = a.astype(np.float64)
            fin = f[np.isfinite(f)]
            if fin.size:
                ranges[v.id] = (float(fin.min()), float(fin.max()))

    for v, a in zip(graph.inputs, arrays):
        env[v.id] = a
        record(v, a)
    for i, node in enumerate(graph.nodes):
        if node.op is Op.PARAM:
            res = np.asarray(params[node.attrs["name"]])
        else:
            res = evaluate(node.op, [env[v.id] for v in node.inputs], node.attrs, node.out.type)
        env[node.out.id] = res
        record(node.out, res)
        for v in node.inputs:
            if last.get(v.id) == i and v.id not in keep:
                env.pop(v.id, None)
    return Calibration(ranges, "example")


def is_max_subtracted(producer, const, v: Value) -> bool:
    """v = a - broadcast(reduce_max(a)) (possibly through a max with -inf, as jax emits);
    ``producer(v)`` gives a value's producing node, ``const(v)`` its compile-time value."""
    p = producer(v)
    if p is None or p.op is not Op.SUB:
        return False
    b = producer(p.inputs[1])
    while b is not None and b.op in (Op.BROADCAST_IN_DIM, Op.RESHAPE, Op.MAX):
        if b.op is Op.MAX:
            nxt = [u for u in b.inputs if const(u) is None]
            if len(nxt) != 1:
                return False
            b = producer(nxt[0])
        else:
            b = producer(b.inputs[0])
    return b is not None and b.op is Op.REDUCE_MAX


def _is_max_subtracted(ctx: RuleContext, v: Value) -> bool:
    return is_max_subtracted(ctx.producer, ctx.const, v)


def lut_domain(ctx: RuleContext, kind: str, x: Value) -> tuple[float, float] | None:
    """The (lo, hi) the LUT for ``kind`` of ``x`` covers; None = the emitter's default."""
    r = ctx.calibration.get(x)
    if kind == "exp" and _is_max_subtracted(ctx, x):
        # always down to EXP_FLOOR, whatever the example showed: a later call's masked or
        # far-below-max score is clamped to the table's start, and only a start where exp has
        # reached the floor entry (~0 next to the row max's 1) makes that clamp harmless; a
        # start at the example's smallest score (say -3) would give every masked key
        # exp(-3) = 0.05 (module docstring)
        return (EXP_FLOOR, 0.0)
    if r is None:
        return None
    lo, hi = r
    w = max(hi - lo, _MIN_WIDTH)
    lo, hi = lo - MARGIN * w, hi + MARGIN * w
    if kind in ("rsqrt", "reciprocal"):
        if r[0] <= 0:
            return None  # not a positive domain: let the emitter's default refuse or clamp
        lo = max(lo, r[0] / 2)
    return (lo, hi)
