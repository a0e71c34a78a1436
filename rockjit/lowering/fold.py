"""Compile-time values of a graph: params, constants and data movement over them."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import WeightError
from ..ir.graph import Graph
from ..ir.ops import Op
from ..ir.reference import evaluate
from .compile_cache import compile_scope_memo

# Ops whose value is known at compile time when all their inputs are.
_FOLDABLE = {Op.BROADCAST_IN_DIM, Op.RESHAPE, Op.TRANSPOSE, Op.CONVERT, Op.SLICE,
             Op.CONCATENATE, Op.PAD, Op.IOTA, Op.CONSTANT}


def fold_consts(graph: Graph, params: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Compile-time values: params, constants, and data movement over them (a resident weight
    seen through a transpose or a bias through a broadcast is still a constant)."""
    out: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        if n.op is Op.PARAM:
            name = n.attrs["name"]
            if name not in params:
                raise WeightError(f"param {name!r} ({n.out.type}) at {n.loc} is not bound")
            out[n.out.id] = np.asarray(params[name])
        elif n.op is Op.CONSTANT:
            # a read-only view, not the interpreter's copy: the range plan folds the graph
            # several times, and the copies of every folded weight were most of that time
            out[n.out.id] = _once(("constant", id(n)), n, lambda: _read_only(n.attrs["value"]))
        elif n.op is Op.BROADCAST_IN_DIM and n.inputs[0].id in out:
            # a read-only view: a scalar broadcast to a large shape must not become a large array
            # (its users read what they need; a write into it fails loudly)
            x = out[n.inputs[0].id]
            out[n.out.id] = _once(("broadcast", id(n), id(x)), (n, x),
                                  lambda: _broadcast_view(x, n.attrs, n.out.type.shape))
        elif n.op in _FOLDABLE and all(v.id in out for v in n.inputs):
            ins = [out[v.id] for v in n.inputs]
            out[n.out.id] = _once(("fold", id(n), tuple(id(a) for a in ins)), (n, ins),
                                  lambda: _read_only(evaluate(n.op, ins, n.attrs, n.out.type)))
    return out


def _broadcast_view(x: np.ndarray, attrs: Mapping[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """broadcast_in_dim (ir/reference.py's meaning) as a zero-copy view."""
    x = np.asarray(x)
    dims = [1] * len(shape)
    for src, dst in enumerate(attrs["broadcast_dimensions"]):
        dims[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(dims), shape)



def _once(key: tuple, keep: Any, compute) -> np.ndarray:
    """``compute()``, made once per compile for the same node and input arrays (``keep``
    holds them, so their ids stay theirs): the range plan folds the graph up to five times,
    and the same array objects let every later scan of a weight (fp16_range.extremes) hit."""
    cache = compile_scope_memo()
    if cache is None:
        return compute()
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = (keep, compute())
    return hit[1]


def _read_only(value: Any) -> np.ndarray:
    v = np.asarray(value).view()
    v.setflags(write=False)
    return v
