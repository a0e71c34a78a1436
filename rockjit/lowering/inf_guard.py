"""Bounds past fp16 that would hide an fp16 overflow.

A value the NPU writes in fp16 is either finite (|x| <= 65504) or an overflow, +-Inf. The range
plan lets values it cannot bound ("assumed": a residual stream) rely on the data staying in range
and catches the rest at run time: an overflow reaches an output as inf/NaN and the call raises
``NumericsError`` (loaded_graph.py). A ``max`` or ``min`` against a constant beyond fp16 on the
side that never binds a finite fp16 value breaks that: ``max(x, -1e5)`` is x for every finite x,
but turns an overflowed -Inf into -1e5, a plausible number that is wrong whenever the true x was
above -1e5 (``jnp.clip(x * 100, -1e5, 1e5)`` with x = 700 gave 1e5 for 7e4).

For an operand whose stored values are fp16 (its producer wrote fp16), such a bound is replaced
by an infinity of the same sign: the result is unchanged for every finite x (the bound never bound
it), and an overflow now stays infinite, so it reaches the output check instead of being clipped
into range. An operand computed in float32 (on the host) keeps the constant: there a value beyond
fp16 is real, and the bound matters. The result of such a max/min is fp16-valued again (so
``jnp.clip``'s max-then-min is guarded twice), which ``fp16_ids`` carries from node to node.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir.graph import Node, Value
from ..ir.ops import Op
from ..ir.types import DType
from .fp16_range import FP16_MAX
from .rules.base import Tensor

# per op: the side of a constant that never binds a finite fp16 operand, and its infinity
_NO_EFFECT = {Op.MAX: (lambda c: c < -FP16_MAX, -np.inf),
              Op.MIN: (lambda c: c > FP16_MAX, np.inf)}


def fp16_valued(tensors: Sequence[Tensor]) -> bool:
    """The value's producer wrote it in fp16 (its first stored tensor: later ones are
    conversions or views of it)."""
    return bool(tensors) and tensors[0].form.dtype == DType.F16


def _fp16_const(a: np.ndarray) -> bool:
    """Every element is an fp16 value or an infinity."""
    with np.errstate(over="ignore"):
        return bool((a.astype(np.float16).astype(a.dtype) == a).all())


def guard_bounds(node: Node, consts: dict[int, np.ndarray],
                 tensors: Mapping[int, Sequence[Tensor]],
                 fresh: Callable[[object], Value], fp16_ids: set[int]) -> Node:
    """``node`` with each no-effect constant bound beyond fp16 made infinite (module doc), as a
    fresh constant value in ``consts``; ``node`` itself when there is none. A max/min of
    fp16-valued operands adds its result to ``fp16_ids``."""
    rule = _NO_EFFECT.get(node.op)
    if rule is None or len(node.inputs) != 2:
        return node
    no_effect, inf = rule

    def fp16(v: Value) -> bool:
        return v.id in fp16_ids or fp16_valued(tensors.get(v.id, ()))

    new = list(node.inputs)
    for i, (c, x) in enumerate((node.inputs, node.inputs[::-1])):
        if c.id not in consts or x.id in consts or not fp16(x):
            continue
        a = np.asarray(consts[c.id])
        if a.dtype.kind != "f":
            continue
        hide = no_effect(a)
        if not hide.any():
            continue
        v = fresh(c.type)
        consts[v.id] = np.where(hide, inf, a).astype(a.dtype)
        new[i] = v
    if all(_fp16_const(np.asarray(consts[v.id])) if v.id in consts else fp16(v) for v in new):
        fp16_ids.add(node.out.id)
    return node if new == list(node.inputs) else replace(node, inputs=tuple(new))
