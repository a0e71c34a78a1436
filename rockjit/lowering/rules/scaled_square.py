"""``v * v`` with ``v = x * 2^-s`` as one DPU pass (issue 9): the square reads x, and the
prescale ``v`` is never written.

A LayerNorm's first statistics pass (range_rewrites._pass1) brings x into the square's fp16
range by an exact power of two and squares it: two flying passes over the cube, the first only
to write v for the second. emitters/eltwise.build_scaled_square applies both factors 2^-s on
the way into the square (the BS and BN MULs of the DPU-only two-operand EW) and rounds once:
fp16((x 2^-s)^2), the two-pass value wherever v is a normal fp16 (its module says why).

Matched (``prescaled_squares``): a float ``mul(v, v)`` whose ``v = mul(x, c)`` (either operand
order) has c a compile-time scalar 2^-s with 1 <= s <= SQUARE_MAX_SHIFT, x a run-time value of
v's shape, v read by that square alone and no graph output. The pipeline lowers such a v only
if something still asks for it (the square's rule fell back to reading v).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...ir.ops import Op
from ..const_views import uniform_value
from ..emitters.eltwise import SQUARE_MAX_SHIFT


def _shift(c: np.ndarray | None) -> int | None:
    """s where the constant is 2^-s, 1 <= s <= SQUARE_MAX_SHIFT, else None."""
    if c is None:
        return None
    value = uniform_value(c)
    if value is None or not value > 0:
        return None
    s = -math.log2(value)
    if s != int(s) or not 1 <= s <= SQUARE_MAX_SHIFT:
        return None
    return int(s)


def prescaled_squares(graph: Graph, consts: Mapping[int, np.ndarray]
                      ) -> dict[int, tuple[Value, Value, int]]:
    """Square value id -> (v, x, s) for every ``mul(v, v)``, ``v = x * 2^-s`` matched."""
    producers, users = graph.producers(), graph.users()
    outputs = {v.id for v in graph.outputs}
    found: dict[int, tuple[Value, Value, int]] = {}
    for n in graph.nodes:
        if n.op is not Op.MUL or n.inputs[0].id != n.inputs[1].id or \
                not n.out.type.dtype.is_float:
            continue
        v = n.inputs[0]
        p: Node | None = producers.get(v.id)
        if p is None or p.op is not Op.MUL or v.id in outputs or v.id in consts or \
                {u.out.id for u in users.get(v.id, [])} != {n.out.id}:
            continue
        for x, c in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
            s = _shift(consts.get(c.id))
            if s is not None and x.id not in consts and x.type.shape == v.type.shape:
                found[n.out.id] = (v, x, s)
                break
    return found

